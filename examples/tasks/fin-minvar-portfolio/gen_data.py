#!/usr/bin/env python3
"""Regenerate files/data/returns.csv (seeded factor model with a correlation regime change)."""
import datetime
import os
import random

SEED = 7311
N_DAYS = 756          # 3 years; the last 252 days have a different bond/equity correlation
ASSETS = ["equity_us", "equity_eu", "govt_bond", "gold", "reit"]
# loadings on (equity factor, rates factor), idiosyncratic daily vol, daily drift
PARAMS = {
    "equity_us": (1.00, 0.00, 0.0045, 0.00040),
    "equity_eu": (0.95, 0.00, 0.0065, 0.00030),
    "govt_bond": (-0.12, 1.00, 0.0012, 0.00010),
    "gold":      (0.10, 0.35, 0.0085, 0.00020),
    "reit":      (1.05, 0.60, 0.0070, 0.00035),
}


def main():
    rng = random.Random(SEED)
    d = datetime.date(2021, 1, 4)
    rows = []
    while len(rows) < N_DAYS:
        if d.weekday() < 5:
            t = len(rows)
            eq = rng.gauss(0, 0.0095)
            rates = rng.gauss(0, 0.0040)
            if t >= 504:  # regime change: bonds and equities fall together
                rates = 0.55 * eq / 0.0095 * 0.0040 + 0.835 * rates
            rets = []
            for a in ASSETS:
                be, br, iv, mu = PARAMS[a]
                rets.append(mu + be * eq + br * rates + rng.gauss(0, iv))
            rows.append((d.isoformat(), rets))
        d += datetime.timedelta(days=1)
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/returns.csv", "w", newline="\n") as f:
        f.write("date," + ",".join(ASSETS) + "\n")
        for day, rets in rows:
            f.write(day + "," + ",".join(f"{r:.6f}" for r in rets) + "\n")


if __name__ == "__main__":
    main()
