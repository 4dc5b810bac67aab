#!/usr/bin/env python3
"""Regenerate files/data/targets.csv (deterministic).

Most targets come from random joint configurations (seeded); a few are placed
on purpose: fully stretched (workspace boundary), too far, too close to the
base, and poses whose preferred elbow branch violates the wrist limit.
"""
import math
import os
import random
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, "files")
from sim.arm import forward, LINKS  # noqa: E402

SEED = 31


def main():
    rng = random.Random(SEED)
    rows = []
    for i in range(8):
        q = (rng.uniform(-3.0, 3.0), rng.uniform(0.2, 2.8), rng.uniform(-1.5, 1.5))
        rows.append(forward(q))
    L1, L2, L3 = LINKS
    # fully stretched at 40 degrees, tool aligned with the arm: the wrist lies 4e-7 m
    # beyond L1 + L2, inside the 1e-6 m reach tolerance (cos q2 must be clamped)
    a = math.radians(40)
    reach = L1 + L2 + L3 + 4e-7
    rows.append((reach * math.cos(a), reach * math.sin(a), a))
    # too far
    rows.append((1.6, 1.4, 0.5))
    # wrist too close to the base (|L1 - L2| = 0.2)
    rows.append((0.35, 0.05, 0.0))
    # preferred branch (q2 >= 0) needs q3 > 1.9 but the other branch is fine
    found = 0
    while found < 2:
        q = (rng.uniform(-3.0, 3.0), rng.uniform(-2.5, -0.4), rng.uniform(-1.6, 1.6))
        x, y, phi = forward(q)
        wx, wy = x - L3 * math.cos(phi), y - L3 * math.sin(phi)
        c2 = (wx * wx + wy * wy - L1 * L1 - L2 * L2) / (2 * L1 * L2)
        q2p = math.acos(max(-1.0, min(1.0, c2)))
        q1p = math.atan2(wy, wx) - math.atan2(L2 * math.sin(q2p), L1 + L2 * math.cos(q2p))
        q3p = math.atan2(math.sin(phi - q1p - q2p), math.cos(phi - q1p - q2p))
        if abs(q3p) > 2.0:
            rows.append((x, y, phi))
            found += 1
    # both branches violate the wrist limit
    rows.append((1.2, 0.0, math.pi))
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/targets.csv", "w", newline="\n") as f:
        f.write("target_id,x,y,phi_deg\n")
        for i, (x, y, phi) in enumerate(rows, 1):
            f.write(f"P{i:02d},{x:.6f},{y:.6f},{math.degrees(phi):.4f}\n")


if __name__ == "__main__":
    main()
