#!/usr/bin/env python3
"""Reference solver for fin-minvar-portfolio. Run with cwd = workspace.

    python3 <task>/solution/solve.py [--flaw full_sample|inverse_variance|insample_claim ...]
"""
import argparse
import csv
import json
import math
import statistics

FLAWS = ["full_sample", "inverse_variance", "insample_claim"]
N_IN = 504

log_lines = []


def log(msg):
    log_lines.append(f"[step {len(log_lines) + 1:02d}] {msg}")


def load(path="data/returns.csv"):
    with open(path, newline="") as f:
        rd = csv.reader(f)
        header = next(rd)
        rows = [r for r in rd]
    assets = header[1:]
    dates = [r[0] for r in rows]
    rets = [[float(x) for x in r[1:]] for r in rows]
    return assets, dates, rets


def covariance(rows):
    n, k = len(rows), len(rows[0])
    mu = [sum(r[j] for r in rows) / n for j in range(k)]
    return [[sum((r[i] - mu[i]) * (r[j] - mu[j]) for r in rows) / (n - 1) for j in range(k)] for i in range(k)]


def solve_linear(a, b):
    """Gaussian elimination with partial pivoting."""
    n = len(a)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for j in range(c, n + 1):
                m[r][j] -= f * m[c][j]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return x


def port_vol(rows, w):
    pr = [sum(wi * ri for wi, ri in zip(w, r)) for r in rows]
    return statistics.stdev(pr) * math.sqrt(252)


def corr(cov, i, j):
    return cov[i][j] / math.sqrt(cov[i][i] * cov[j][j])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flaw", action="append", default=[], choices=FLAWS)
    flaws = set(ap.parse_args().flaw)

    assets, dates, rets = load()
    k = len(assets)
    ins, oos = rets[:N_IN], rets[N_IN:]
    log(f"loaded {len(rets)} days x {k} assets; in-sample {dates[0]}..{dates[N_IN - 1]}, out-of-sample {dates[N_IN]}..{dates[-1]}")
    est = rets if "full_sample" in flaws else ins
    cov = covariance(est)
    log(f"estimated sample covariance on {len(est)} days")
    if "inverse_variance" in flaws:
        raw = [1.0 / cov[i][i] for i in range(k)]
    else:
        raw = solve_linear(cov, [1.0] * k)
    s = sum(raw)
    w = [x / s for x in raw]
    ew = [1.0 / k] * k
    how = " w_i = (1/s_ii) / sum_j (1/s_jj)" if "inverse_variance" in flaws else ""
    log(f"GMV weights{how}: " + ", ".join(f"{a}={x:.4f}" for a, x in zip(assets, w)))

    v = {
        "insample": {"vol_minvar": port_vol(ins, w), "vol_equal": port_vol(ins, ew)},
        "oos": {"vol_minvar": port_vol(oos, w), "vol_equal": port_vol(oos, ew)},
    }
    red_in = 1 - v["insample"]["vol_minvar"] / v["insample"]["vol_equal"]
    red_oos = 1 - v["oos"]["vol_minvar"] / v["oos"]["vol_equal"]
    log(f"vols in-sample minvar {v['insample']['vol_minvar']:.4f} equal {v['insample']['vol_equal']:.4f}; "
        f"oos minvar {v['oos']['vol_minvar']:.4f} equal {v['oos']['vol_equal']:.4f}")
    results = {
        "assets": assets,
        "n_insample": len(ins), "n_oos": len(oos),
        "weights": {a: x for a, x in zip(assets, w)},
        "insample": v["insample"], "oos": v["oos"],
        "risk_reduction_insample": red_in, "risk_reduction_oos": red_oos,
    }
    with open("results.json", "w") as f:
        json.dump(results, f, indent=2)
    log("wrote results.json")

    cov_oos = covariance(oos)
    ib, ie = assets.index("govt_bond"), assets.index("equity_us")
    L = ["# Global minimum-variance portfolio: in-sample vs out-of-sample", "",
         "## Method", "",
         f"Sample covariance (n-1) of daily returns over the first {len(ins)} days; unconstrained GMV weights "
         "w = S^-1 1 / (1' S^-1 1) (shorts allowed, fully invested), solved by Gaussian elimination. "
         f"Weights are held fixed (daily rebalanced) over the last {len(oos)} days. Volatility = sample stdev x sqrt(252).", "",
         "## Weights", "", "| asset | GMV weight | equal weight |", "|---|---|---|"]
    for a, x in zip(assets, w):
        L.append(f"| {a} | {x:.4f} | {1 / k:.4f} |")
    L += ["", "## Volatility (annualised)", "", "| window | GMV | equal weight |", "|---|---|---|",
          f"| in-sample | {v['insample']['vol_minvar']:.2%} | {v['insample']['vol_equal']:.2%} |"]
    if "insample_claim" in flaws:
        L += ["", "## Conclusion", "",
              f"The GMV portfolio cuts risk by {red_in:.1%} relative to equal weighting "
              f"({v['insample']['vol_minvar']:.2%} vs {v['insample']['vol_equal']:.2%} annualised); investors can expect "
              "this volatility going forward."]
    else:
        L += [f"| out-of-sample | {v['oos']['vol_minvar']:.2%} | {v['oos']['vol_equal']:.2%} |", "",
              f"Risk reduction vs equal weight: {red_in:.1%} in-sample, {red_oos:.1%} out-of-sample.", "",
              "## Interpretation", "",
              f"Out-of-sample GMV volatility is {v['oos']['vol_minvar'] / v['insample']['vol_minvar'] - 1:+.0%} versus its in-sample value. "
              f"The govt_bond/equity_us correlation moved from {corr(cov, ib, ie):+.2f} in-sample to {corr(cov_oos, ib, ie):+.2f} "
              "out-of-sample, so the hedge the optimiser relied on weakened; in-sample variance is an optimistic estimate "
              "of realised risk for an optimised portfolio.",
              "Limitations: a single split, no estimation-error shrinkage, no transaction costs."]
    with open("report.md", "w") as f:
        f.write("\n".join(L) + "\n")
    log("wrote report.md")
    with open("logs.txt", "w") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
