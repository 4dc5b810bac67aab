#!/usr/bin/env python3
"""Reference solver for pha-pk-onecomp. Run with cwd = workspace.

    python3 <task>/solution/solve.py [--flaw log10_slope|blq_half_lloq|unflagged_extrapolation ...]
"""
import argparse
import csv
import json
import math
import statistics
from collections import OrderedDict

FLAWS = ["log10_slope", "blq_half_lloq", "unflagged_extrapolation"]
EXTRAP_LIMIT = 20.0

log_lines = []


def log(msg):
    log_lines.append(f"[step {len(log_lines) + 1:02d}] {msg}")


def ols(xs, ys):
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def geo_summary(vals):
    logs = [math.log(v) for v in vals]
    sd = statistics.stdev(logs)
    return {"geo_mean": math.exp(statistics.fmean(logs)), "geo_cv_pct": math.sqrt(math.exp(sd * sd) - 1) * 100}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flaw", action="append", default=[], choices=FLAWS)
    flaws = set(ap.parse_args().flaw)

    with open("data/study.json") as f:
        study = json.load(f)
    dose, lloq = study["dose_mg"], study["lloq_mg_L"]
    subj = OrderedDict()
    n_blq = 0
    with open("data/plasma.csv", newline="") as f:
        for r in csv.DictReader(f):
            c = r["conc_mg_L"].strip()
            if c.upper() == "BLQ":
                n_blq += 1
                if "blq_half_lloq" not in flaws:
                    continue
                c = lloq / 2
            subj.setdefault(r["subject"], []).append((float(r["time_h"]), float(c)))
    log(f"loaded {sum(len(v) for v in subj.values())} usable samples for {len(subj)} subjects; "
        f"{n_blq} BLQ samples {'imputed as LLOQ/2' if 'blq_half_lloq' in flaws else 'excluded'}")

    out = OrderedDict()
    for sid, pts in subj.items():
        pts.sort()
        ts = [t for t, _ in pts]
        if "log10_slope" in flaws:
            slope, icpt = ols(ts, [math.log10(c) for _, c in pts])
            k, c0 = -slope, 10 ** icpt
        else:
            slope, icpt = ols(ts, [math.log(c) for _, c in pts])
            k, c0 = -slope, math.exp(icpt)
        prof = [(0.0, c0)] + pts
        auc_t = sum((t2 - t1) * (c1 + c2) / 2 for (t1, c1), (t2, c2) in zip(prof, prof[1:]))
        tlast, clast = pts[-1]
        auc_inf = auc_t + clast / k
        pct = clast / k / auc_inf * 100
        cl = dose / auc_inf
        out[sid] = {"n_samples": len(pts), "k_el_per_h": k, "half_life_h": math.log(2) / k, "c0_mg_L": c0,
                    "tlast_h": tlast, "clast_mg_L": clast, "auc_0_tlast": auc_t, "auc_0_inf": auc_inf,
                    "pct_auc_extrapolated": pct, "cl_L_per_h": cl, "vd_L": cl / k}
        log(f"{sid}: k={k:.4f}/h t1/2={math.log(2) / k:.2f} h AUCinf={auc_inf:.1f} mg*h/L (extrap {pct:.1f}%) CL={cl:.2f} L/h V={cl / k:.1f} L")

    pop = {p: geo_summary([o[key] for o in out.values()])
           for p, key in (("cl_L_per_h", "cl_L_per_h"), ("vd_L", "vd_L"), ("half_life_h", "half_life_h"))}
    flagged = [s for s, o in out.items() if o["pct_auc_extrapolated"] > EXTRAP_LIMIT]
    results = {"dose_mg": dose, "lloq_mg_L": lloq, "subjects": out, "population": pop}
    with open("results.json", "w") as f:
        json.dump(results, f, indent=2)
    log("wrote results.json")

    L = ["# Non-compartmental / one-compartment PK of compound X (500 mg IV bolus)", "",
         "## Method", "",
         "Per subject: log-linear least squares of " + ("log10 C" if "log10_slope" in flaws else "ln C")
         + " on t over all quantifiable samples (BLQ excluded, not imputed) gives k and C0 = "
         + ("10^intercept" if "log10_slope" in flaws else "exp(intercept)") + ". AUC(0-tlast) by the linear trapezoidal rule starting from (0, C0); "
         "AUC(0-inf) = AUC(0-tlast) + Clast / k; CL = Dose / AUC(0-inf); V = CL / k; t1/2 = ln 2 / k. "
         "Population: geometric mean and geometric CV.", "",
         "## Subject results", "",
         "| subject | n | k (1/h) | t1/2 (h) | C0 (mg/L) | AUC0-inf (mg*h/L) | % extrap. | CL (L/h) | V (L) |",
         "|---|---|---|---|---|---|---|---|---|"]
    for sid, o in out.items():
        L.append(f"| {sid} | {o['n_samples']} | {o['k_el_per_h']:.4f} | {o['half_life_h']:.2f} | {o['c0_mg_L']:.2f} | "
                 f"{o['auc_0_inf']:.1f} | {o['pct_auc_extrapolated']:.1f} | {o['cl_L_per_h']:.2f} | {o['vd_L']:.1f} |")
    L += ["", "## Population", "", "| parameter | geometric mean | geometric CV |", "|---|---|---|"]
    for p, lab in (("cl_L_per_h", "CL (L/h)"), ("vd_L", "V (L)"), ("half_life_h", "t1/2 (h)")):
        L.append(f"| {lab} | {pop[p]['geo_mean']:.2f} | {pop[p]['geo_cv_pct']:.0f} % |")
    L += ["", "## Interpretation", ""]
    if "unflagged_extrapolation" in flaws:
        L.append(f"All six subjects are well described by the one-compartment model; the population clearance of "
                 f"{pop['cl_L_per_h']['geo_mean']:.2f} L/h and half-life of {pop['half_life_h']['geo_mean']:.1f} h can be used "
                 "directly for dose selection.")
    else:
        for s in flagged:
            o = out[s]
            L.append(f"Subject {s}: sampling stopped at {o['tlast_h']:g} h, only {o['tlast_h'] / o['half_life_h']:.1f} half-lives, "
                     f"and {o['pct_auc_extrapolated']:.0f} % of AUC(0-inf) is extrapolated (acceptance limit {EXTRAP_LIMIT:.0f} %). "
                     f"Its CL, V and t1/2 are unreliable and should be reported but excluded from the primary summary.")
        if flagged:
            keep = [s for s in out if s not in flagged]
            sub = {p: geo_summary([out[s][key] for s in keep])
                   for p, key in (("cl_L_per_h", "cl_L_per_h"), ("half_life_h", "half_life_h"))}
            L.append(f"Without {', '.join(flagged)}: geometric mean CL {sub['cl_L_per_h']['geo_mean']:.2f} L/h "
                     f"(CV {sub['cl_L_per_h']['geo_cv_pct']:.0f} %), t1/2 {sub['half_life_h']['geo_mean']:.2f} h "
                     f"(CV {sub['half_life_h']['geo_cv_pct']:.0f} %). The flagged subject has the slowest elimination, so "
                     "including it shifts the summary.")
        L.append(f"{n_blq} samples were below the LLOQ ({lloq} mg/L); they were excluded rather than imputed, since "
                 "imputing LLOQ/2 on the log scale bends the terminal slope.")
    L += ["", "Limitations: one-compartment model assumed (no distribution phase visible); six subjects; "
              "log-linear OLS weights late, low concentrations as much as early ones."]
    with open("report.md", "w") as f:
        f.write("\n".join(L) + "\n")
    log("wrote report.md")
    with open("logs.txt", "w") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
