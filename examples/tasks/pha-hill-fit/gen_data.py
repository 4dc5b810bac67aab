#!/usr/bin/env python3
"""Regenerate files/data/dose_response.csv (seeded, deterministic).

Two compounds, 10 half-log concentrations (0.001 .. 30 uM), triplicates,
4-parameter Hill model plus Gaussian noise (sd 4 % points). Compound B is weak:
its EC50 lies close to the top concentration, so its maximal effect is poorly
determined by the design.
"""
import os
import random

SEED = 1234
CONCS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0]
TRUE = {"A": (2.0, 98.0, 0.12, 1.4), "B": (1.0, 92.0, 9.0, 1.1)}   # E0, Emax, EC50 uM, Hill n


def hill(c, e0, emax, ec50, n):
    return e0 + (emax - e0) / (1 + (ec50 / c) ** n)


def main():
    rng = random.Random(SEED)
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/dose_response.csv", "w", newline="\n") as f:
        f.write("compound,conc_uM,replicate,response_pct\n")
        for comp, p in TRUE.items():
            for c in CONCS:
                for rep in (1, 2, 3):
                    f.write(f"{comp},{c:g},{rep},{hill(c, *p) + rng.gauss(0, 4.0):.2f}\n")


if __name__ == "__main__":
    main()
