#!/usr/bin/env python3
"""Reference solver for fin-var-backtest. Run with cwd = workspace.

    python3 <task>/solution/solve.py [--flaw window_includes_today|normal_var|kupiec_only_verdict ...]
"""
import argparse
import csv
import json
import math
import statistics

FLAWS = ["window_includes_today", "normal_var", "kupiec_only_verdict"]
W, P = 250, 0.01
K = int(W * P) + 1          # 3rd smallest return in the window
Z99 = 2.3263478740408408

log_lines = []


def log(msg):
    log_lines.append(f"[step {len(log_lines) + 1:02d}] {msg}")


def xlogy(x, y):
    return 0.0 if x == 0 else x * math.log(y)


def chi2_1_sf(lr):
    return math.erfc(math.sqrt(max(lr, 0.0) / 2.0))


def kupiec(x, n, p):
    lr = -2.0 * (xlogy(n - x, 1 - p) + xlogy(x, p) - xlogy(n - x, 1 - x / n) - xlogy(x, x / n))
    return lr, chi2_1_sf(lr)


def christoffersen_ind(hits):
    n = {(a, b): 0 for a in (0, 1) for b in (0, 1)}
    for a, b in zip(hits, hits[1:]):
        n[(a, b)] += 1
    n00, n01, n10, n11 = n[(0, 0)], n[(0, 1)], n[(1, 0)], n[(1, 1)]
    pi0 = n01 / (n00 + n01) if n00 + n01 else 0.0
    pi1 = n11 / (n10 + n11) if n10 + n11 else 0.0
    pi = (n01 + n11) / (n00 + n01 + n10 + n11)
    l0 = xlogy(n00 + n10, 1 - pi) + xlogy(n01 + n11, pi)
    l1 = xlogy(n00, 1 - pi0) + xlogy(n01, pi0) + xlogy(n10, 1 - pi1) + xlogy(n11, pi1)
    lr = -2.0 * (l0 - l1)
    return lr, chi2_1_sf(lr), {"n00": n00, "n01": n01, "n10": n10, "n11": n11}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flaw", action="append", default=[], choices=FLAWS)
    flaws = set(ap.parse_args().flaw)

    with open("data/returns.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    dates = [r["date"] for r in rows]
    rets = [float(r["ret"]) for r in rows]
    log(f"loaded {len(rets)} daily returns ({dates[0]} .. {dates[-1]})")

    vars_, hits = [], []
    for t in range(W, len(rets)):
        window = rets[t - W + 1: t + 1] if "window_includes_today" in flaws else rets[t - W: t]
        if "normal_var" in flaws:
            v = -(statistics.fmean(window) - Z99 * statistics.stdev(window))
        else:
            v = -sorted(window)[K - 1]
        vars_.append(v)
        hits.append(1 if rets[t] < -v else 0)
    n, x = len(hits), sum(hits)
    kind = "normal" if "normal_var" in flaws else "historical"
    log(f"rolling {W}-day {kind} VaR{int((1 - P) * 100)} for {n} days; {x} exceedances (expected {n * P:.0f})")
    lr_pof, p_pof = kupiec(x, n, P)
    lr_ind, p_ind, trans = christoffersen_ind(hits)
    log(f"Kupiec POF LR={lr_pof:.3f} p={p_pof:.4f}; Christoffersen independence LR={lr_ind:.3f} p={p_ind:.4f} {trans}")
    exc_dates = [dates[W + i] for i, h in enumerate(hits) if h]
    results = {
        "window": W, "confidence": 1 - P, "eval_start": dates[W], "n_days": n,
        "exceedances": x, "expected_exceedances": n * P, "exceedance_rate": x / n,
        "exceedance_dates": exc_dates,
        "mean_var": statistics.fmean(vars_), "max_var": max(vars_), "min_var": min(vars_),
        "kupiec": {"lr": lr_pof, "p_value": p_pof},
        "christoffersen_ind": {"lr": lr_ind, "p_value": p_ind, **trans},
    }
    with open("results.json", "w") as f:
        json.dump(results, f, indent=2)
    log("wrote results.json")

    L = ["# 99% one-day historical-simulation VaR: backtest", "",
         "## Method", "",
         f"For each day t from {dates[W]} the VaR is "
         + ("-(mean - 2.326 x stdev) of" if "normal_var" in flaws else f"minus the {K}rd smallest of")
         + (f" the {W} returns up to and including day t (days t-{W - 1}..t)."
            if "window_includes_today" in flaws else
            f" the {W} returns *before* day t (days t-{W}..t-1; day t itself is never in its own window).")
         + " An exceedance is a return below -VaR. "
         "Coverage is tested with Kupiec's proportion-of-failures LR, clustering with Christoffersen's independence LR "
         "(both chi-square with 1 df).", "",
         "## Results", "",
         f"- evaluation days: {n}; exceedances: {x} (expected {n * P:.0f}, rate {x / n:.2%})",
         f"- VaR level: mean {statistics.fmean(vars_):.4f}, range {min(vars_):.4f} .. {max(vars_):.4f}",
         f"- Kupiec POF: LR = {lr_pof:.3f}, p = {p_pof:.3f}",
         f"- Christoffersen independence: LR = {lr_ind:.3f}, p = {p_ind:.3f} "
         f"(transitions 00={trans['n00']}, 01={trans['n01']}, 10={trans['n10']}, 11={trans['n11']})",
         f"- exceedance dates: {', '.join(exc_dates)}", ""]
    L += ["## Verdict", ""]
    if "kupiec_only_verdict" in flaws:
        ok = p_pof > 0.05
        L.append(f"The Kupiec test {'does not reject' if ok else 'rejects'} correct coverage at 5 %, so the model is "
                 f"{'adequate and can be kept as is' if ok else 'inadequate'}.")
    else:
        cov_ok, ind_ok = p_pof > 0.05, p_ind > 0.05
        L.append(f"Unconditional coverage: {'not rejected' if cov_ok else 'rejected'} at 5 % (p = {p_pof:.3f}). "
                 f"Independence: {'not rejected' if ind_ok else 'rejected'} at 5 % (p = {p_ind:.3f}).")
        if cov_ok and not ind_ok:
            back = [d for i, d in enumerate(exc_dates[1:], 1)
                    if dates.index(d) - dates.index(exc_dates[i - 1]) == 1]
            L.append(f"The exceedance count alone looks acceptable, but exceedances cluster ({trans['n11']} back-to-back pairs, "
                     f"e.g. ending {', '.join(back)}): a {W}-day historical window adapts slowly when volatility jumps, "
                     "so losses arrive in bunches exactly when risk is highest. The model fails conditional coverage and "
                     "should not be kept as is; a volatility-scaled (filtered) historical simulation or EWMA VaR is the "
                     "natural next step.")
        elif cov_ok and ind_ok:
            L.append("Neither test rejects; with ~10 expected exceedances the tests have low power, so this is weak evidence.")
        else:
            L.append("Coverage is rejected; the VaR level is mis-calibrated.")
    L += ["", "Limitations: one synthetic series; 1000 test days give few exceedances, so both tests have low power."]
    with open("report.md", "w") as f:
        f.write("\n".join(L) + "\n")
    log("wrote report.md")
    with open("logs.txt", "w") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
