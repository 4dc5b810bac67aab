#!/usr/bin/env python3
"""Regenerate files/data/prices.csv (seeded, deterministic). Run from this folder."""
import datetime
import os
import random

SEED = 20240601
N_DAYS = 1260


def business_days(start, n):
    d = start
    out = []
    while len(out) < n:
        if d.weekday() < 5:
            out.append(d)
        d += datetime.timedelta(days=1)
    return out


def main():
    rng = random.Random(SEED)
    days = business_days(datetime.date(2019, 1, 2), N_DAYS)
    price = 100.0
    drift = 0.0
    left = 0
    rows = []
    for d in days:
        if left <= 0:  # regime switch: trending up, trending down or sideways
            drift = rng.choice([0.0011, 0.0009, -0.0010, 0.0, 0.0002])
            left = rng.randint(40, 180)
        left -= 1
        vol = 0.011 + 0.004 * (drift < 0)
        price *= 1.0 + drift + rng.gauss(0.0, vol)
        rows.append((d.isoformat(), round(price, 2)))
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/prices.csv", "w", newline="\n") as f:
        f.write("date,close\n")
        for d, p in rows:
            f.write(f"{d},{p:.2f}\n")


if __name__ == "__main__":
    main()
