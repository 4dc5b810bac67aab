#!/usr/bin/env python3
"""Reference solver for pha-arrhenius-shelf-life. Run with cwd = workspace.

    python3 <task>/solution/solve.py [--flaw celsius_arrhenius|zero_order|point_estimate_label ...]
"""
import argparse
import csv
import json
import math
import statistics
from collections import OrderedDict

FLAWS = ["celsius_arrhenius", "zero_order", "point_estimate_label"]
R = 8.314462618
T975_DF2 = 4.302652729911275   # Student t, 97.5 % quantile, 2 degrees of freedom
DAYS_PER_MONTH = 30.4375

log_lines = []


def log(msg):
    log_lines.append(f"[step {len(log_lines) + 1:02d}] {msg}")


def ols(xs, ys):
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    resid = [y - a - b * x for x, y in zip(xs, ys)]
    s = math.sqrt(sum(r * r for r in resid) / (len(xs) - 2))
    return a, b, s, mx, sxx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flaw", action="append", default=[], choices=FLAWS)
    flaws = set(ap.parse_args().flaw)

    data = OrderedDict()
    with open("data/stability.csv", newline="") as f:
        for r in csv.DictReader(f):
            data.setdefault(int(r["temp_C"]), []).append((float(r["time_days"]), float(r["assay_pct"])))
    log(f"loaded {sum(len(v) for v in data.values())} assays at {list(data)} C")

    ks, r2s = OrderedDict(), {}
    for temp, pts in data.items():
        ts = [t for t, _ in pts]
        if "zero_order" in flaws:
            a, b, s, _, _ = ols(ts, [y for _, y in pts])
            k = -b / a          # fraction of initial lost per day (zero-order)
        else:
            a, b, s, _, _ = ols(ts, [math.log(y) for _, y in pts])
            k = -b
        ks[temp] = k
        log(f"{temp} C: {'zero' if 'zero_order' in flaws else 'first'}-order k = {k:.5e} /day")

    tk = lambda c: c if "celsius_arrhenius" in flaws else c + 273.15  # noqa: E731
    xs = [1 / tk(t) for t in ks]
    ys = [math.log(k) for k in ks.values()]
    a, b, s, mx, sxx = ols(xs, ys)
    ea = -b * R / 1000
    log(f"Arrhenius fit ln k = {a:.3f} + ({b:.1f}) / T: Ea = {ea:.2f} kJ/mol, residual sd {s:.4f}")

    def predict(temp_c):
        x0 = 1 / tk(temp_c)
        lnk = a + b * x0
        se = s * math.sqrt(1 / len(xs) + (x0 - mx) ** 2 / sxx)
        return math.exp(lnk), math.exp(lnk + T975_DF2 * se)

    def t90(k):
        return 0.1 / k if "zero_order" in flaws else math.log(10 / 9) / k

    k25, k25_hi = predict(25)
    k30, _ = predict(30)
    res = {"k_per_day": {str(t): k for t, k in ks.items()}, "ea_kJ_mol": ea, "ln_A": a,
           "k25_per_day": k25, "k30_per_day": k30,
           "t90_25C_days": t90(k25), "t90_25C_months": t90(k25) / DAYS_PER_MONTH,
           "t90_30C_days": t90(k30), "t90_30C_months": t90(k30) / DAYS_PER_MONTH,
           "k25_upper95_per_day": k25_hi, "t90_25C_lower95_days": t90(k25_hi),
           "t90_25C_lower95_months": t90(k25_hi) / DAYS_PER_MONTH}
    with open("results.json", "w") as f:
        json.dump(res, f, indent=2)
    log(f"t90 at 25 C = {res['t90_25C_months']:.1f} months (95 % lower bound {res['t90_25C_lower95_months']:.1f}); "
        f"at 30 C = {res['t90_30C_months']:.1f} months")
    log("wrote results.json")

    L = ["# Shelf-life prediction from accelerated stability data (Arrhenius)", "", "## Method", "",
         "First-order degradation at each temperature: OLS of ln(assay) on time (both replicates, free intercept), k = -slope. "
         "Arrhenius: OLS of ln k on 1/T " + ("(T in C)" if "celsius_arrhenius" in flaws else "(T in kelvin)") + ", Ea = -slope x R. Prediction at 25 C and 30 C; "
         "t90 = ln(10/9) / k (time to lose 10 % of the initial potency). A 95 % upper bound for k at 25 C uses the "
         "regression standard error of the predicted mean ln k and t(0.975, 2 df) = 4.303.", "",
         "## Rate constants", "", "| temperature (C) | k (1/day) | t90 (days) |", "|---|---|---|"]
    for t, k in ks.items():
        L.append(f"| {t} | {k:.4e} | {t90(k):.1f} |")
    L += ["", f"Ea = {ea:.1f} kJ/mol; ln A = {a:.2f} (k in 1/day).", "",
          "## Predictions", "", "| condition | k (1/day) | t90 (days) | t90 (months) |", "|---|---|---|---|",
          f"| 25 C | {k25:.3e} | {res['t90_25C_days']:.0f} | {res['t90_25C_months']:.1f} |",
          f"| 30 C | {k30:.3e} | {res['t90_30C_days']:.0f} | {res['t90_30C_months']:.1f} |",
          f"| 25 C, 95 % conservative bound | {k25_hi:.3e} | {res['t90_25C_lower95_days']:.0f} | "
          f"{res['t90_25C_lower95_months']:.1f} |", "", "## Recommendation", ""]
    if "point_estimate_label" in flaws:
        label = math.ceil(res["t90_25C_months"] / 6) * 6
        L.append(f"The predicted t90 at 25 C is {res['t90_25C_months']:.1f} months, so a {label}-month shelf life at "
                 "room temperature is supported by the data.")
    else:
        label = math.floor(res["t90_25C_lower95_months"] / 6) * 6
        L.append(f"The point estimate ({res['t90_25C_months']:.1f} months at 25 C) is an extrapolation 15 C below the coldest tested condition, from "
                 f"four rate constants, and its 95 % bound is {res['t90_25C_lower95_months']:.1f} months. A provisional label "
                 f"of {label} months (25 C) is defensible, to be confirmed by real-time data at 25 C / 60 % RH; for climatic "
                 f"zone IV storage (30 C) the estimate falls to {res['t90_30C_months']:.1f} months.")
        L.append("The extrapolation assumes the same degradation mechanism at all temperatures; the Arrhenius residual "
                 f"sd ({s:.3f} in ln k) shows no curvature across 40-70 C, but this cannot exclude a mechanism change "
                 "below 40 C, and the bound ignores the uncertainty of each k.")
    L += ["", "Limitations: two replicates per time point; humidity not studied; first-order kinetics assumed."]
    with open("report.md", "w") as f:
        f.write("\n".join(L) + "\n")
    log("wrote report.md")
    with open("logs.txt", "w") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
