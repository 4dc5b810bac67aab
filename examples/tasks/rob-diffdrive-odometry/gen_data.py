#!/usr/bin/env python3
"""Regenerate files/data/{robot.json,encoders.csv,ground_truth.csv} (seeded, deterministic).

The true robot differs from its nominal parameters: the right wheel's effective
radius is 0.6 % larger and the effective wheel base 1.2 % larger. The first 40 s
are mostly straight driving with gentle arcs, the last 40 s contain tight arcs
and turns on the spot (which expose the wheel-base error). Encoders are
quantised cumulative tick counts at 25 Hz; ground truth (motion capture) is at
1 Hz with 5 mm / 2 mrad noise.
"""
import json
import math
import os
import random

SEED = 2718
R_NOM, B_NOM, TPR = 0.05, 0.30, 2048
R_LEFT, R_RIGHT, B_TRUE = 0.05, 0.05 * 1.006, 0.30 * 1.012
RATE, T_END, SIM_DT = 25, 80.0, 0.001
# (duration s, forward speed m/s, yaw rate rad/s)
SEGMENTS = [(6, 0.5, 0.0), (5, 0.45, 0.12), (7, 0.5, 0.0), (6, 0.4, -0.15), (5, 0.5, 0.0),
            (6, 0.45, 0.1), (5, 0.5, 0.0),
            (4, 0.3, 0.6), (3, 0.0, 1.2), (5, 0.5, 0.0), (4, 0.25, -0.8), (3, 0.0, -1.3),
            (5, 0.45, 0.3), (4, 0.0, 1.0), (5, 0.4, -0.5), (4, 0.3, 0.7), (3, 0.5, 0.0)]


def main():
    assert abs(sum(s[0] for s in SEGMENTS) - T_END) < 1e-9
    rng = random.Random(SEED)
    x = y = th = 0.0
    phl = phr = 0.0
    enc, gt = [], []
    n = int(round(T_END / SIM_DT))
    bounds, acc = [], 0.0
    for d, v, w in SEGMENTS:
        acc += d
        bounds.append((acc, v, w))
    seg = 0
    for k in range(n + 1):
        t = k * SIM_DT
        if k % int(round(1 / (RATE * SIM_DT))) == 0:
            enc.append((t, math.floor(phl / (2 * math.pi) * TPR), math.floor(phr / (2 * math.pi) * TPR)))
        if k % int(round(1 / SIM_DT)) == 0:
            gt.append((t, x + rng.gauss(0, 0.005), y + rng.gauss(0, 0.005),
                       math.atan2(math.sin(th), math.cos(th)) + rng.gauss(0, 0.002)))
        if k == n:
            break
        while seg < len(bounds) - 1 and t >= bounds[seg][0] - 1e-12:
            seg += 1
        _, v, w = bounds[seg]
        vl, vr = v - w * B_TRUE / 2, v + w * B_TRUE / 2
        phl += vl / R_LEFT * SIM_DT
        phr += vr / R_RIGHT * SIM_DT
        dl, dr = vl * SIM_DT, vr * SIM_DT
        ds, dth = (dl + dr) / 2, (dr - dl) / B_TRUE
        x += ds * math.cos(th + dth / 2)
        y += ds * math.sin(th + dth / 2)
        th += dth
    os.makedirs("files/data", exist_ok=True)
    with open("files/data/robot.json", "w") as f:
        json.dump({"wheel_radius_m": R_NOM, "wheel_base_m": B_NOM, "ticks_per_rev": TPR,
                   "encoder_rate_hz": RATE, "start_pose": [0.0, 0.0, 0.0]}, f, indent=2)
        f.write("\n")
    with open("files/data/encoders.csv", "w", newline="\n") as f:
        f.write("t,left_ticks,right_ticks\n")
        for t, a, b in enc:
            f.write(f"{t:.2f},{a},{b}\n")
    with open("files/data/ground_truth.csv", "w", newline="\n") as f:
        f.write("t,x,y,theta\n")
        for t, gx, gy, gth in gt:
            f.write(f"{t:.2f},{gx:.4f},{gy:.4f},{gth:.4f}\n")


if __name__ == "__main__":
    main()
