#!/usr/bin/env python3
"""Regenerate files/data/stability.csv (seeded, deterministic).

Accelerated stability study: first-order degradation with Arrhenius temperature
dependence (Ea = 88 kJ/mol, true t90 at 25 C = 800 days), assay noise sd 0.6 %
of label claim, initial assay ~100.4 %.
"""
import math
import os
import random

SEED = 555
R = 8.314462618
EA = 88_000.0
K25 = math.log(100 / 90) / 800.0
PLAN = {40: [0, 14, 28, 56, 84, 112], 50: [0, 14, 28, 56, 84, 112],
        60: [0, 7, 14, 28, 42, 56], 70: [0, 7, 14, 21, 28, 42]}


def main():
    rng = random.Random(SEED)
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/stability.csv", "w", newline="\n") as f:
        f.write("temp_C,time_days,assay_pct\n")
        for temp, days in PLAN.items():
            k = K25 * math.exp(-EA / R * (1 / (temp + 273.15) - 1 / 298.15))
            for d in days:
                for rep in range(2):
                    f.write(f"{temp},{d},{100.4 * math.exp(-k * d) + rng.gauss(0, 0.6):.2f}\n")


if __name__ == "__main__":
    main()
