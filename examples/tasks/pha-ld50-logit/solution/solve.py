#!/usr/bin/env python3
"""Reference solver for pha-ld50-logit. Run with cwd = workspace.

    python3 <task>/solution/solve.py [--flaw empirical_logit_ls|symmetric_dose_ci|point_category ...]
"""
import argparse
import csv
import json
import math

FLAWS = ["empirical_logit_ls", "symmetric_dose_ci", "point_category"]
Z = 1.959963984540054
GHS = [(5, 1), (50, 2), (300, 3), (2000, 4), (5000, 5)]
CHI2_95 = {1: 3.841, 2: 5.991, 3: 7.815, 4: 9.488, 5: 11.070, 6: 12.592, 7: 14.067, 8: 15.507, 9: 16.919, 10: 18.307}

log_lines = []


def log(msg):
    log_lines.append(f"[step {len(log_lines) + 1:02d}] {msg}")


def ghs(ld50):
    for limit, cat in GHS:
        if ld50 <= limit:
            return cat
    return None  # not classified


def logistic_mle(rows):
    """Newton-Raphson for logit(p) = a + b log10(dose); returns a, b and the inverse information."""
    a = b = 0.0
    for it in range(100):
        ga = gb = haa = hab = hbb = 0.0
        for x, n, k in rows:
            p = 1 / (1 + math.exp(-(a + b * x)))
            w = n * p * (1 - p)
            ga += k - n * p
            gb += (k - n * p) * x
            haa += w
            hab += w * x
            hbb += w * x * x
        det = haa * hbb - hab * hab
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        a, b = a + da, b + db
        if abs(da) + abs(db) < 1e-13:
            break
    # information at the final estimate
    haa = hab = hbb = 0.0
    for x, n, k in rows:
        p = 1 / (1 + math.exp(-(a + b * x)))
        w = n * p * (1 - p)
        haa, hab, hbb = haa + w, hab + w * x, hbb + w * x * x
    det = haa * hbb - hab * hab
    return a, b, {"var_a": hbb / det, "var_b": haa / det, "cov_ab": -hab / det}, it + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flaw", action="append", default=[], choices=FLAWS)
    flaws = set(ap.parse_args().flaw)

    with open("data/mortality.csv", newline="") as f:
        raw = [(float(r["dose_mg_kg"]), int(r["n_animals"]), int(r["n_dead"])) for r in csv.DictReader(f)]
    rows = [(math.log10(d), n, k) for d, n, k in raw]
    log(f"loaded {len(raw)} dose groups, {sum(n for _, n, _ in raw)} animals, {sum(k for _, _, k in raw)} deaths")

    if "empirical_logit_ls" in flaws:
        pts = [(x, math.log(k / (n - k))) for x, n, k in rows if 0 < k < n]
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        b = sum((x - mx) * (y - my) for x, y in pts) / sxx
        a = my - b * mx
        s2 = sum((y - a - b * x) ** 2 for x, y in pts) / (len(pts) - 2)
        cov = {"var_a": s2 * (1 / len(pts) + mx * mx / sxx), "var_b": s2 / sxx, "cov_ab": -s2 * mx / sxx}
        log(f"least squares on empirical logits of {len(pts)} groups (0 % and 100 % groups dropped)")
    else:
        a, b, cov, iters = logistic_mle(rows)
        log(f"maximum-likelihood logistic fit by Newton-Raphson converged in {iters} iterations")
    m = -a / b
    var_m = (cov["var_a"] + 2 * m * cov["cov_ab"] + m * m * cov["var_b"]) / (b * b)
    ld50 = 10 ** m
    if "symmetric_dose_ci" in flaws:
        se_ld = ld50 * math.log(10) * math.sqrt(var_m)
        ci = [ld50 - Z * se_ld, ld50 + Z * se_ld]
    else:
        ci = [10 ** (m - Z * math.sqrt(var_m)), 10 ** (m + Z * math.sqrt(var_m))]
    ld10 = 10 ** ((math.log(0.1 / 0.9) - a) / b)
    ld90 = 10 ** ((math.log(0.9 / 0.1) - a) / b)
    chi2 = dev = 0.0
    for x, n, k in rows:
        p = 1 / (1 + math.exp(-(a + b * x)))
        chi2 += (k - n * p) ** 2 / (n * p * (1 - p))
        for obs, exp_ in ((k, n * p), (n - k, n * (1 - p))):
            if obs > 0:
                dev += 2 * obs * math.log(obs / exp_)
    log(f"a={a:.4f} b={b:.4f} LD50={ld50:.1f} mg/kg 95% CI {ci[0]:.1f}-{ci[1]:.1f}; Pearson chi2={chi2:.3f} deviance={dev:.3f}")

    cat_point = ghs(ld50)
    cats_ci = sorted({ghs(ci[0]), ghs(ci[1])})
    results = {"model": "logit(p) = a + b * log10(dose)", "a": a, "b": b,
               "se_a": math.sqrt(cov["var_a"]), "se_b": math.sqrt(cov["var_b"]), "cov_ab": cov["cov_ab"],
               "ld50_mg_kg": ld50, "ld50_ci95_mg_kg": ci, "ld10_mg_kg": ld10, "ld90_mg_kg": ld90,
               "pearson_chi2": chi2, "deviance": dev, "df": len(rows) - 2, "ghs_category_point": cat_point}
    with open("results.json", "w") as f:
        json.dump(results, f, indent=2)
    log("wrote results.json")

    if "empirical_logit_ls" in flaws:
        method = ("Least-squares line through the empirical logits ln(dead / alive) against log10(dose); groups with 0 % or "
                  "100 % mortality have infinite logits and were left out.")
    else:
        method = ("Binomial logistic regression of mortality on log10(dose), fitted by maximum likelihood (Newton-Raphson) "
                  "using all groups, including 0 % and 100 % mortality.")
    method += (" LD50 = 10^(-a/b); 95 % interval by the delta method"
               + (" on the dose scale." if "symmetric_dose_ci" in flaws else
                  " on log10 LD50 (so it is asymmetric on the dose scale).")
               + " Goodness of fit: Pearson chi-square and deviance on k - 2 df.")
    L = ["# Acute oral toxicity: LD50 by logistic regression", "", "## Method", "", method, "",
         "## Data and fit", "", "| dose (mg/kg) | n | dead | observed | fitted |", "|---|---|---|---|---|"]
    for (d, n, k), (x, _, _) in zip(raw, rows):
        p = 1 / (1 + math.exp(-(a + b * x)))
        L.append(f"| {d:g} | {n} | {k} | {k / n:.0%} | {p:.1%} |")
    L += ["", f"Intercept a = {a:.3f} (SE {math.sqrt(cov['var_a']):.3f}); slope b = {b:.3f} per log10 unit (SE {math.sqrt(cov['var_b']):.3f}).",
          f"LD50 = {ld50:.1f} mg/kg (95 % CI {ci[0]:.1f}-{ci[1]:.1f}); LD10 = {ld10:.1f}; LD90 = {ld90:.1f} mg/kg.",
          f"Pearson chi-square = {chi2:.3f}, deviance = {dev:.3f} on {len(rows) - 2} df (5 % critical value "
          f"{CHI2_95[len(rows) - 2]}): " + ("no evidence of lack of fit." if max(chi2, dev) < CHI2_95[len(rows) - 2]
                                           else "lack of fit; the interval should be inflated by chi2/df."), "",
          "## Classification (GHS acute oral)", ""]
    if "point_category" in flaws:
        lims = [0] + [lim for lim, _ in GHS]
        L.append(f"With LD50 = {ld50:.0f} mg/kg the substance is GHS Category {cat_point} "
                 f"({lims[cat_point - 1]} < LD50 <= {lims[cat_point]} mg/kg).")
    else:
        if len(cats_ci) > 1:
            L.append(f"The point estimate ({ld50:.0f} mg/kg) falls in Category {cat_point}, but the 95 % interval "
                     f"({ci[0]:.0f}-{ci[1]:.0f} mg/kg) straddles the 300 mg/kg boundary between Categories {cats_ci[0]} and "
                     f"{cats_ci[-1]}. The data cannot exclude Category {cats_ci[0]} ('Toxic if swallowed'); a protective "
                     f"classification is Category {cats_ci[0]}, or additional animals near 200-400 mg/kg would be needed to "
                     "resolve it (ideally with a fixed-dose or up-and-down design).")
        else:
            L.append(f"The whole 95 % interval lies in Category {cat_point}.")
    L += ["", "Limitations: 10 animals per group; one sex; delta-method interval is approximate (Fieller's interval "
              "would be somewhat wider)."]
    with open("report.md", "w") as f:
        f.write("\n".join(L) + "\n")
    log("wrote report.md")
    with open("logs.txt", "w") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
