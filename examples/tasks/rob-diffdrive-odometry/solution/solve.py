#!/usr/bin/env python3
"""Reference solver for rob-diffdrive-odometry. Run with cwd = workspace.

    python3 <task>/solution/solve.py [--flaw swapped_wheels|euler_heading|insample_only ...]
"""
import argparse
import csv
import json
import math

FLAWS = ["swapped_wheels", "euler_heading", "insample_only"]
T_SPLIT = 40.0
PHI = (math.sqrt(5) - 1) / 2

log_lines = []


def log(msg):
    log_lines.append(f"[step {len(log_lines) + 1:02d}] {msg}")


def wrap(a):
    return math.atan2(math.sin(a), math.cos(a))


def odometry(enc, robot, scale_right=1.0, base_scale=1.0, euler=False):
    """Dead-reckon poses at every encoder sample (midpoint-heading arc integration)."""
    r, b, tpr = robot["wheel_radius_m"], robot["wheel_base_m"] * base_scale, robot["ticks_per_rev"]
    x, y, th = robot["start_pose"]
    poses = [(x, y, th)]
    k = 2 * math.pi * r / tpr
    for (_, l0, r0), (_, l1, r1) in zip(enc, enc[1:]):
        dl = (l1 - l0) * k
        dr = (r1 - r0) * k * scale_right
        ds, dth = (dl + dr) / 2, (dr - dl) / b
        h = th if euler else th + dth / 2
        x += ds * math.cos(h)
        y += ds * math.sin(h)
        th += dth
        poses.append((x, y, th))
    return poses


def rmse(poses, gt, idx, sel):
    errs = [(poses[idx[t]][0] - gx) ** 2 + (poses[idx[t]][1] - gy) ** 2 for t, gx, gy, _ in gt if sel(t)]
    return math.sqrt(sum(errs) / len(errs))


def golden(f, lo, hi, tol=1e-7):
    a, b = lo, hi
    c, d = b - PHI * (b - a), a + PHI * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - PHI * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + PHI * (b - a)
            fd = f(d)
    return (a + b) / 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flaw", action="append", default=[], choices=FLAWS)
    flaws = set(ap.parse_args().flaw)
    euler = "euler_heading" in flaws

    with open("data/robot.json") as f:
        robot = json.load(f)
    with open("data/encoders.csv", newline="") as f:
        enc = [(float(r["t"]), int(r["left_ticks"]), int(r["right_ticks"])) for r in csv.DictReader(f)]
    if "swapped_wheels" in flaws:
        enc = [(t, rr, ll) for t, ll, rr in enc]
    with open("data/ground_truth.csv", newline="") as f:
        gt = [(float(r["t"]), float(r["x"]), float(r["y"]), float(r["theta"])) for r in csv.DictReader(f)]
    rate = robot["encoder_rate_hz"]
    idx = {t: int(round(t * rate)) for t, *_ in gt}
    cols = " (columns read as t, right, left)" if "swapped_wheels" in flaws else ""
    log(f"loaded {len(enc)} encoder samples{cols} at {rate} Hz and {len(gt)} ground-truth poses; robot {robot}")

    calib = lambda t: t <= T_SPLIT  # noqa: E731
    hold = lambda t: t > T_SPLIT  # noqa: E731
    allp = lambda t: True  # noqa: E731
    raw = odometry(enc, robot, euler=euler)
    path = sum(math.hypot(b[0] - a[0], b[1] - a[1]) for a, b in zip(raw, raw[1:]))
    log(f"raw odometry: final pose {tuple(round(v, 4) for v in raw[-1])}, RMSE all {rmse(raw, gt, idx, allp):.4f} m")

    s = golden(lambda sc: rmse(odometry(enc, robot, sc, euler=euler), gt, idx, calib), 0.98, 1.02)
    cal = odometry(enc, robot, s, euler=euler)
    log(f"golden-section calibration of the right-wheel scale on t <= {T_SPLIT:g} s: s_R = {s:.6f}")

    def summary(poses):
        x, y, th = poses[-1]
        return {"final_pose": [x, y, wrap(th)], "rmse_all": rmse(poses, gt, idx, allp),
                "rmse_calib": rmse(poses, gt, idx, calib), "rmse_holdout": rmse(poses, gt, idx, hold)}

    res_raw, res_cal = summary(raw), summary(cal)
    res_cal["scale_right"] = s
    log(f"calibrated: RMSE calib {res_cal['rmse_calib']:.4f} m, holdout {res_cal['rmse_holdout']:.4f} m "
        f"(raw {res_raw['rmse_calib']:.4f} / {res_raw['rmse_holdout']:.4f})")

    two = None
    if "insample_only" not in flaws:
        # diagnostic: does a wheel-base error explain the remaining hold-out drift?
        sr, sb = s, 1.0
        for _ in range(4):
            sb = golden(lambda q: rmse(odometry(enc, robot, sr, q, euler), gt, idx, calib), 0.97, 1.03, 1e-6)
            sr = golden(lambda q: rmse(odometry(enc, robot, q, sb, euler), gt, idx, calib), 0.98, 1.02, 1e-6)
        p2 = odometry(enc, robot, sr, sb, euler)
        two = {"scale_right": sr, "base_scale": sb, "rmse_calib": rmse(p2, gt, idx, calib),
               "rmse_holdout": rmse(p2, gt, idx, hold)}
        log(f"diagnostic 2-parameter fit (s_R, s_b) = ({sr:.5f}, {sb:.5f}): holdout RMSE {two['rmse_holdout']:.4f} m")
        # heading error growth in the hold-out window, single-parameter calibration
        herr = [(t, wrap(cal[idx[t]][2] - gth)) for t, _, _, gth in gt]
        two["heading_err_calib_end"] = max(abs(e) for t, e in herr if calib(t))
        two["heading_err_holdout_end"] = abs(herr[-1][1])

    results = {"path_length_m": path, "t_split_s": T_SPLIT, "raw": res_raw, "calibrated": res_cal}
    if two:
        results["diagnostic_two_param"] = two
    with open("results.json", "w") as f:
        json.dump(results, f, indent=2)
    log("wrote results.json")

    L = ["# Wheel odometry of the differential-drive robot: drift and calibration", "",
         "## Method", "",
         f"Encoder ticks -> wheel arc lengths (2 pi r / {robot['ticks_per_rev']} per tick), "
         + ("Euler integration with the heading at the start of each interval (x += ds cos(theta))" if euler else
            "arc integration with the midpoint heading (x += ds cos(theta + dtheta/2))") + ", start pose (0, 0, 0). Position RMSE is taken at the 1 Hz motion-capture poses. "
         f"The right-wheel scale s_R is fitted by golden-section search on [0.98, 1.02] using only t <= {T_SPLIT:g} s; "
         f"t > {T_SPLIT:g} s is a hold-out.", "",
         "## Results", "", f"Path length {path:.2f} m.", "",
         "| | final x | final y | final theta | RMSE calib (t<=40) | RMSE hold-out | RMSE all |", "|---|---|---|---|---|---|---|"]
    for name, r in (("raw", res_raw), (f"calibrated (s_R = {s:.5f})", res_cal)):
        L.append(f"| {name} | {r['final_pose'][0]:.3f} | {r['final_pose'][1]:.3f} | {r['final_pose'][2]:.3f} | "
                 f"{r['rmse_calib']:.4f} | {r['rmse_holdout']:.4f} | {r['rmse_all']:.4f} |")
    L.append("")
    if "insample_only" in flaws:
        L += ["## Conclusion", "",
              f"Calibrating the right wheel reduces the odometry error from {res_raw['rmse_calib']:.3f} m to "
              f"{res_cal['rmse_calib']:.3f} m RMSE: the drift was caused by the wheel-radius mismatch and is now removed; "
              "the calibrated odometry can be used without correction."]
    else:
        ratio = res_cal["rmse_holdout"] / res_cal["rmse_calib"]
        L += ["## Interpretation", "",
              f"The right-wheel scale fixes most of the drift (raw hold-out RMSE {res_raw['rmse_holdout']:.2f} m), but after "
              f"calibration the hold-out RMSE ({res_cal['rmse_holdout']:.3f} m) is still {ratio:.1f}x the calibration-window RMSE "
              f"({res_cal['rmse_calib']:.3f} m), so the in-sample figure overstates the accuracy. The hold-out contains tight arcs and turns on the spot; "
              f"the heading error of the calibrated odometry grows from at most {two['heading_err_calib_end']:.3f} rad in the "
              f"first 40 s to {two['heading_err_holdout_end']:.3f} rad at the end, which a radius error alone does not explain.",
              f"Diagnostic: fitting the wheel base as well gives s_R = {two['scale_right']:.4f}, effective base "
              f"{two['base_scale']:.4f} x nominal ({robot['wheel_base_m'] * two['base_scale']:.4f} m), and hold-out RMSE "
              f"{two['rmse_holdout']:.3f} m. The straight-driving calibration window cannot identify the wheel base; a proper "
              "calibration should include turning manoeuvres (e.g. a UMBmark square in both directions).",
              "Limitations: one run; ground-truth noise ~5 mm; systematic errors only (no slip model)."]
    with open("report.md", "w") as f:
        f.write("\n".join(L) + "\n")
    log("wrote report.md")
    with open("logs.txt", "w") as f:
        f.write("\n".join(log_lines) + "\n")


if __name__ == "__main__":
    main()
