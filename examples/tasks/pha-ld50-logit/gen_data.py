#!/usr/bin/env python3
"""Regenerate files/data/mortality.csv (seeded, deterministic).

Acute oral toxicity study: 7 dose groups of 10 animals, deaths drawn from a
log10-logistic dose-response with true LD50 = 320 mg/kg and slope 4.5 per log10
unit. SEED was chosen (by scanning seeds with this generator) so that the fitted
LD50 lies just above the 300 mg/kg GHS category 3/4 boundary while its 95 %
interval extends below it.
"""
import math
import os
import random

SEED = 74
DOSES = [50, 100, 200, 300, 450, 700, 1000]
N = 10
LD50, SLOPE = 320.0, 4.5


def simulate(seed):
    rng = random.Random(seed)
    rows = []
    for d in DOSES:
        p = 1 / (1 + math.exp(-SLOPE * (math.log10(d) - math.log10(LD50))))
        rows.append((d, N, sum(rng.random() < p for _ in range(N))))
    return rows


def main():
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/mortality.csv", "w", newline="\n") as f:
        f.write("dose_mg_kg,n_animals,n_dead\n")
        for d, n, k in simulate(SEED):
            f.write(f"{d},{n},{k}\n")


if __name__ == "__main__":
    main()
