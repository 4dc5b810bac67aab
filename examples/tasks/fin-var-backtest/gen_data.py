#!/usr/bin/env python3
"""Regenerate files/data/returns.csv: GARCH(1,1) daily returns with Student-t(5) shocks."""
import datetime
import math
import os
import random

SEED = 4253
N = 1250
OMEGA, ALPHA, BETA, NU = 2.0e-6, 0.10, 0.88, 5


def main():
    rng = random.Random(SEED)
    var = OMEGA / (1 - ALPHA - BETA)
    d = datetime.date(2019, 1, 2)
    rows = []
    r_prev = 0.0
    while len(rows) < N:
        if d.weekday() < 5:
            var = OMEGA + ALPHA * r_prev ** 2 + BETA * var
            chi2 = sum(rng.gauss(0, 1) ** 2 for _ in range(NU))
            z = rng.gauss(0, 1) / math.sqrt(chi2 / NU) * math.sqrt((NU - 2) / NU)
            r = 0.0003 + math.sqrt(var) * z
            rows.append((d.isoformat(), r))
            r_prev = r - 0.0003
        d += datetime.timedelta(days=1)
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/returns.csv", "w", newline="\n") as f:
        f.write("date,ret\n")
        for day, r in rows:
            f.write(f"{day},{r:.6f}\n")


if __name__ == "__main__":
    main()
