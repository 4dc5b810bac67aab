#!/usr/bin/env python3
"""Reference solver for pha-hill-fit. Run with cwd = workspace.

    python3 <task>/solution/solve.py [--flaw fixed_hill|fit_means|extrapolated_emax ...]
"""
import argparse
import csv
import json
import math
from collections import defaultdict

FLAWS = ["fixed_hill", "fit_means", "extrapolated_emax"]
LN10 = math.log(10)
Z95 = 1.959963984540054

log_lines = []


def log(msg):
    log_lines.append(f"[step {len(log_lines) + 1:02d}] {msg}")


def model(c, p):
    e0, emax, lec, n = p
    return e0 + (emax - e0) / (1 + 10 ** (n * (lec - math.log10(c))))


def sse(data, p):
    return sum((y - model(c, p)) ** 2 for c, y in data)


def nelder_mead(f, x0, steps, iters=4000, tol=1e-13):
    pts = [list(x0)]
    for i, s in enumerate(steps):
        x = list(x0)
        x[i] += s
        pts.append(x)
    vals = [f(x) for x in pts]
    for _ in range(iters):
        order = sorted(range(len(pts)), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] <= tol * (1 + abs(vals[0])):
            break
        cen = [sum(p[j] for p in pts[:-1]) / (len(pts) - 1) for j in range(len(x0))]
        xr = [cen[j] + (cen[j] - pts[-1][j]) for j in range(len(x0))]
        fr = f(xr)
        if fr < vals[0]:
            xe = [cen[j] + 2 * (cen[j] - pts[-1][j]) for j in range(len(x0))]
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = [cen[j] + 0.5 * (pts[-1][j] - cen[j]) for j in range(len(x0))]
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                for i in range(1, len(pts)):
                    pts[i] = [pts[0][j] + 0.5 * (pts[i][j] - pts[0][j]) for j in range(len(x0))]
                    vals[i] = f(pts[i])
    best = min(range(len(pts)), key=lambda i: vals[i])
    return pts[best], vals[best]


def jacobian_row(c, p):
    e0, emax, lec, n = p
    u = n * (lec - math.log10(c))
    g = 1 / (1 + 10 ** u)
    dg = -LN10 * g * (1 - g)
    return [1 - g, g, (emax - e0) * dg * n, (emax - e0) * dg * (lec - math.log10(c))]


def invert(a):
    k = len(a)
    m = [row[:] + [1.0 if i == j else 0.0 for j in range(k)] for i, row in enumerate(a)]
    for c in range(k):
        piv = max(range(c, k), key=lambda r: abs(m[r][c]))
        m[c], m[piv] = m[piv], m[c]
        d = m[c][c]
        m[c] = [v / d for v in m[c]]
        for r in range(k):
            if r != c:
                f = m[r][c]
                m[r] = [a_ - f * b_ for a_, b_ in zip(m[r], m[c])]
    return [row[k:] for row in m]


def fit(data, fixed_n=None):
    cs = sorted({c for c, _ in data})
    lo = sum(y for c, y in data if c == cs[0]) / sum(1 for c, _ in data if c == cs[0])
    hi = sum(y for c, y in data if c == cs[-1]) / sum(1 for c, _ in data if c == cs[-1])
    mid = (lo + hi) / 2
    lec0 = math.log10(min(cs, key=lambda c: abs(sum(y for cc, y in data if cc == c) / sum(1 for cc, _ in data if cc == c) - mid)))
    if fixed_n is None:
        f = lambda q: sse(data, q)  # noqa: E731
        x, _ = nelder_mead(f, [lo, hi, lec0, 1.0], [5.0, 5.0, 0.5, 0.3])
        x, _ = nelder_mead(f, x, [1.0, 1.0, 0.1, 0.05])   # restart to escape premature collapse
        p = x
        free = [0, 1, 2, 3]
    else:
        f = lambda q: sse(data, [q[0], q[1], q[2], fixed_n])  # noqa: E731
        x, _ = nelder_mead(f, [lo, hi, lec0], [5.0, 5.0, 0.5])
        x, _ = nelder_mead(f, x, [1.0, 1.0, 0.1])
        p = x + [fixed_n]
        free = [0, 1, 2]
    s = sse(data, p)
    dof = len(data) - len(free)
    rows = [[jacobian_row(c, p)[j] for j in free] for c, _ in data]
    jtj = [[sum(r[i] * r[j] for r in rows) for j in range(len(free))] for i in range(len(free))]
    cov = invert(jtj)
    se = [None] * 4
    for k, j in enumerate(free):
        se[j] = math.sqrt(s / dof * cov[k][k])
    ys = [y for _, y in data]
    ybar = sum(ys) / len(ys)
    r2 = 1 - s / sum((y - ybar) ** 2 for y in ys)
    return p, se, s, r2, dof


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flaw", action="append", default=[], choices=FLAWS)
    flaws = set(ap.parse_args().flaw)

    data = defaultdict(list)
    with open("data/dose_response.csv", newline="") as f:
        for r in csv.DictReader(f):
            data[r["compound"]].append((float(r["conc_uM"]), float(r["response_pct"])))
    log(f"loaded {sum(len(v) for v in data.values())} responses for compounds {sorted(data)}")

    out = {}
    for comp in sorted(data):
        pts = data[comp]
        if "fit_means" in flaws:
            groups = defaultdict(list)
            for c, y in pts:
                groups[c].append(y)
            pts = [(c, sum(v) / len(v)) for c, v in sorted(groups.items())]
        p, se, s, r2, dof = fit(pts, fixed_n=1.0 if "fixed_hill" in flaws else None)
        e0, emax, lec, n = p
        ci = [10 ** (lec - Z95 * se[2]), 10 ** (lec + Z95 * se[2])]
        cmax = max(c for c, _ in pts)
        top_frac = (model(cmax, p) - e0) / (emax - e0)
        out[comp] = {"e0": e0, "emax": emax, "ec50_uM": 10 ** lec, "log10_ec50": lec, "hill": n,
                     "se": {"e0": se[0], "emax": se[1], "log10_ec50": se[2], "hill": se[3]},
                     "ec50_ci95_uM": ci, "sse": s, "r2": r2, "n_points": len(pts),
                     "top_conc_uM": cmax, "fraction_of_max_effect_at_top_conc": top_frac}
        log(f"{comp}: Nelder-Mead fit E0={e0:.2f} Emax={emax:.2f} EC50={10 ** lec:.4g} uM n={n:.3f} SSE={s:.2f} R2={r2:.4f}")
    ratio = out["B"]["ec50_uM"] / out["A"]["ec50_uM"]
    results = {"model": "E = E0 + (Emax - E0) / (1 + (EC50 / C)^n)", "compounds": out, "potency_ratio_B_over_A": ratio}
    with open("results.json", "w") as f:
        json.dump(results, f, indent=2)
    log("wrote results.json")

    L = ["# Dose-response (Hill / Emax) analysis of compounds A and B", "",
         "## Method", "",
         "Four-parameter Hill model E = E0 + (Emax - E0) / (1 + (EC50/C)^n) fitted by least squares to every replicate "
         "(Nelder-Mead on (E0, Emax, log10 EC50, n), restarted once). Standard errors from the asymptotic covariance "
         "s^2 (J'J)^-1 with s^2 = SSE / (N - 4); 95 % Wald interval for log10 EC50.", "",
         "## Parameters", "", "| | A | B |", "|---|---|---|"]
    rows = [("E0 (%)", lambda o: f"{o['e0']:.2f} +/- {o['se']['e0']:.2f}"),
            ("Emax (%)", lambda o: f"{o['emax']:.2f} +/- {o['se']['emax']:.2f}"),
            ("EC50 (uM)", lambda o: f"{o['ec50_uM']:.4g} [{o['ec50_ci95_uM'][0]:.3g}, {o['ec50_ci95_uM'][1]:.3g}]"),
            ("Hill n", lambda o: f"{o['hill']:.3f}" + (f" +/- {o['se']['hill']:.3f}" if o['se']['hill'] is not None else " (fixed)")),
            ("R^2", lambda o: f"{o['r2']:.4f}"),
            ("effect at top conc. / fitted max", lambda o: f"{o['fraction_of_max_effect_at_top_conc']:.0%}")]
    for name, fmt in rows:
        L.append(f"| {name} | {fmt(out['A'])} | {fmt(out['B'])} |")
    a, b = out["A"], out["B"]
    L += ["", f"Potency ratio EC50(B) / EC50(A) = {ratio:.1f}: A is about {ratio:.0f}x more potent.", "", "## Interpretation", ""]
    if "extrapolated_emax" in flaws:
        L.append(f"B is a full agonist with Emax {b['emax']:.1f} %, so A and B have comparable efficacy and differ only in potency.")
    else:
        flagged = [k for k, o in out.items() if o["fraction_of_max_effect_at_top_conc"] < 0.9]
        for k in flagged:
            o = out[k]
            L.append(f"Compound {k} does not reach a plateau: at the top concentration ({o['top_conc_uM']:g} uM, only "
                     f"{o['top_conc_uM'] / o['ec50_uM']:.1f}x its EC50) it gives {o['fraction_of_max_effect_at_top_conc']:.0%} of "
                     f"its fitted maximal effect. Its Emax ({o['emax']:.1f} +/- {o['se']['emax']:.1f} %) is an extrapolation, "
                     f"and its EC50 interval is wide ({o['ec50_ci95_uM'][0]:.3g}-{o['ec50_ci95_uM'][1]:.3g} uM) because Emax and EC50 "
                     "trade off. Whether it is a full or partial agonist cannot be decided from these data; the efficacy "
                     "comparison with A is inconclusive. Extend the range to at least 10x EC50 (e.g. 100-300 uM) or check solubility.")
        if not flagged:
            L.append("Both compounds reach a plateau within the tested range.")
        L.append(f"Compound A is well characterised (plateau reached, EC50 interval {a['ec50_ci95_uM'][0]:.3g}-{a['ec50_ci95_uM'][1]:.3g} uM, "
                 f"Hill slope {a['hill']:.2f}).")
    L += ["", "Limitations: one assay run per compound; constant-variance least squares; Wald intervals are approximate for "
              "poorly identified parameters."]
    with open("report.md", "w") as f:
        f.write("\n".join(L) + "\n")
    log("wrote report.md")
    with open("logs.txt", "w") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
