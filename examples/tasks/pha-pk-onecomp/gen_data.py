#!/usr/bin/env python3
"""Regenerate files/data/plasma.csv and files/data/study.json (seeded, deterministic).

One-compartment IV bolus (500 mg), six subjects, proportional log-normal assay
error (CV ~6 %), LLOQ 0.5 mg/L (values below are reported as BLQ). Subject S6
dropped out after the 8 h sample and eliminates slowly, so most of its AUC is
extrapolated.
"""
import json
import math
import os
import random

SEED = 8080
DOSE, LLOQ = 500.0, 0.5
TIMES = [0.25, 0.5, 1, 2, 4, 6, 8, 12, 24]
SUBJECTS = {  # V (L), k (1/h), last sampling time
    "S1": (38.0, 0.17, 24), "S2": (45.0, 0.12, 24), "S3": (31.0, 0.29, 24),
    "S4": (52.0, 0.22, 24), "S5": (35.0, 0.35, 24), "S6": (42.0, 0.075, 8),
}


def main():
    rng = random.Random(SEED)
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/study.json", "w") as f:
        json.dump({"drug": "compound X", "route": "IV bolus", "dose_mg": DOSE, "lloq_mg_L": LLOQ,
                   "conc_unit": "mg/L", "time_unit": "h"}, f, indent=2)
        f.write("\n")
    with open("files/data/plasma.csv", "w", newline="\n") as f:
        f.write("subject,time_h,conc_mg_L\n")
        for sid, (v, k, tmax) in SUBJECTS.items():
            for t in TIMES:
                if t > tmax:
                    continue
                c = DOSE / v * math.exp(-k * t) * math.exp(rng.gauss(0, 0.06))
                f.write(f"{sid},{t:g},{'BLQ' if c < LLOQ else f'{c:.3f}'}\n")


if __name__ == "__main__":
    main()
