#!/usr/bin/env python3
"""Regenerate files/data/bonds.csv and files/data/portfolio.csv (deterministic).

Prices come from a smooth upward-sloping yield curve plus a small seeded
bond-specific spread, priced with semiannual coupons on a coupon date (no
accrued interest) and rounded to 4 decimals.
"""
import math
import os
import random

SEED = 99
BONDS = [  # id, annual coupon %, maturity (years)
    ("T1Y", 4.50, 1.0), ("T2Y", 4.25, 2.0), ("T3Y", 3.75, 3.0), ("T5Y", 3.50, 5.0),
    ("T7Y", 4.00, 7.0), ("Z10", 0.00, 10.0), ("T20Y", 4.75, 20.0), ("T30Y", 2.25, 30.0),
]
FACE = {"T1Y": 2_000_000, "T2Y": 3_000_000, "T3Y": 1_500_000, "T5Y": 4_000_000,
        "T7Y": 2_500_000, "Z10": 3_000_000, "T20Y": 1_000_000, "T30Y": 2_000_000}


def price(c, m, y):
    n = int(round(m * 2))
    cf = c / 2
    return sum(cf / (1 + y / 2) ** k for k in range(1, n + 1)) + 100 / (1 + y / 2) ** n


def main():
    rng = random.Random(SEED)
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/bonds.csv", "w", newline="\n") as f:
        f.write("bond_id,coupon_pct,maturity_years,price\n")
        for bid, c, m in BONDS:
            y = 0.036 + 0.012 * (1 - math.exp(-m / 6)) + rng.uniform(-0.0015, 0.0015)
            f.write(f"{bid},{c:.2f},{m:.1f},{price(c, m, y):.4f}\n")
    with open("files/data/portfolio.csv", "w", newline="\n") as f:
        f.write("bond_id,face_value\n")
        for bid, _, _ in BONDS:
            f.write(f"{bid},{FACE[bid]}\n")


if __name__ == "__main__":
    main()
