#!/usr/bin/env python3
"""Validator for rob-diffdrive-odometry.

Run from the workspace root:  python3 checks/validate.py
Recomputes midpoint-heading wheel odometry from data/encoders.csv and
data/robot.json, the position RMSE against data/ground_truth.csv (calibration
window t <= 40 s, hold-out t > 40 s), and the right-wheel scale that minimises
the calibration-window RMSE, then compares results.json.
Exit 0 = all pass, 1 = a check failed, 2 = a deliverable is missing.
"""

# ---- shared validator helpers (same in every task) ----
import hashlib
import json
import math
import os
import re
import sys

# BEGIN PROTECTED MANIFEST (regenerate with examples/tasks/refresh_manifests.py)
PROTECTED = {
    "data/robot.json": "d28bf7b2e5d84810c56af15667060535908e0efc483ad84c4401f9e46331ce51",
    "data/encoders.csv": "9a4af0688bae8f9b84fbb9a1588b179caf86d62145eef8a7067c9e7c10d91e3c",
    "data/ground_truth.csv": "1f5f3fce688aee115ec14371a3904068db4e5b9c44edc2425fcaa56c52bc9b41",
}
# END PROTECTED MANIFEST

DELIVERABLES = ["report.md", "results.json", "logs.txt"]

_results = []
_missing = []


def check(name, ok, detail=""):
    """Record and print one check line."""
    ok = bool(ok)
    name = re.sub(r"\s+", "_", str(name).strip())  # names never contain spaces
    _results.append((name, ok, detail))
    detail = str(detail).replace("\n", " ")
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    return ok


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(65536), b""):
            h.update(chunk)
    return h.hexdigest()


def check_deliverables():
    for d in DELIVERABLES:
        if os.path.isfile(d):
            check(f"deliverable:{d}", True, "present")
        else:
            _missing.append(d)
            check(f"deliverable:{d}", False, "missing")


def check_protected():
    for path, digest in sorted(PROTECTED.items()):
        try:
            got = sha256_of(path)
        except OSError:
            check(f"protected:{path}", False, "protected file is missing")
            continue
        if got == digest:
            check(f"protected:{path}", True, "sha256 matches manifest")
        else:
            check(f"protected:{path}", False,
                  f"file was modified (sha256 {got[:12]}... != manifest {digest[:12]}...)")


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def load_json(path):
    """Return (object, error). Never raises."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), ""
    except FileNotFoundError:
        return None, "missing"
    except (ValueError, OSError, RecursionError) as e:
        return None, f"unreadable JSON ({type(e).__name__}: {str(e)[:80]})"


def get(obj, *keys):
    """Nested lookup that returns None instead of raising."""
    for k in keys:
        if isinstance(obj, dict) and k in obj:
            obj = obj[k]
        elif isinstance(obj, list) and isinstance(k, int) and -len(obj) <= k < len(obj):
            obj = obj[k]
        else:
            return None
    return obj


def num(x):
    """A finite float, or None for anything else (bools, strings, NaN...)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        x = float(x)
    except (OverflowError, ValueError):
        return None
    return x if math.isfinite(x) else None


def short(x, n=40):
    s = repr(x)
    return s if len(s) <= n else s[: n - 3] + "..."


def check_num(name, got, want, rel=0.0, abs_=0.0):
    g = num(got)
    if g is None:
        return check(name, False, f"missing or non-numeric value {short(got)} (expected {want:.6g})")
    tol = max(abs_, rel * abs(want))
    ok = abs(g - want) <= tol
    return check(name, ok, f"reported {g:.6g}, expected {want:.6g} (tolerance {tol:.3g})")


def check_int(name, got, want):
    ok = isinstance(got, int) and not isinstance(got, bool) and got == want
    return check(name, ok, f"reported {short(got)}, expected {want}")


_NUM_RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def numbers_in(text):
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text or "")
    out = []
    for m in _NUM_RE.finditer(text):
        try:
            v = float(m.group(0))
        except ValueError:
            continue
        if math.isfinite(v):
            out.append(v)
    return out


def mentions(text, value, rel=0.01, abs_=0.0, percent=True):
    """True if some number written in text matches value (or value*100 as a percentage)."""
    cands = [value, -value]
    if percent:
        cands += [value * 100.0, -value * 100.0]
    for v in numbers_in(text):
        for c in cands:
            if abs(v - c) <= max(abs_, rel * abs(c)):
                return True
    return False


def check_report(text, min_chars, needed):
    """needed: list of (label, value, rel, abs_) numbers the report must state."""
    if text is None:
        check("report:content", False, "report.md missing")
        return
    n = len(text.strip())
    check("report:length", n >= min_chars, f"{n} characters (minimum {min_chars})")
    for label, value, rel, abs_ in needed:
        check(f"report:mentions:{label}", mentions(text, value, rel, abs_),
              f"report states {label} ~ {value:.4g}" if mentions(text, value, rel, abs_)
              else f"no number in report.md matches {label} = {value:.4g}")


def check_logs(min_lines=3):
    text = read_text("logs.txt")
    if text is None:
        check("logs:history", False, "logs.txt missing")
        return
    lines = [ln for ln in text.splitlines() if ln.strip()]
    check("logs:history", len(lines) >= min_lines,
          f"{len(lines)} non-empty lines (minimum {min_lines})")


def finish():
    k = sum(1 for _, ok, _ in _results if ok)
    n = len(_results)
    print(f"SCORE {k}/{n}")
    sys.stdout.flush()
    if _missing:
        sys.exit(2)
    sys.exit(0 if (n > 0 and k == n) else 1)


def run(main):
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # never show a traceback: report a failed check instead
        check("validator:internal", False,
              f"could not complete checks ({type(e).__name__}: {str(e)[:120]})")
    finish()

# ---- task-specific checks ----
import csv


def load():
    with open("data/robot.json") as f:
        robot = json.load(f)
    with open("data/encoders.csv", newline="") as f:
        enc = [(int(r["left_ticks"]), int(r["right_ticks"])) for r in csv.DictReader(f)]
    with open("data/ground_truth.csv", newline="") as f:
        gt = [(float(r["t"]), float(r["x"]), float(r["y"])) for r in csv.DictReader(f)]
    return robot, enc, gt


def dead_reckon(robot, enc, s_right):
    k = 2 * math.pi * robot["wheel_radius_m"] / robot["ticks_per_rev"]
    b = robot["wheel_base_m"]
    x, y, th = robot["start_pose"]
    out = [(x, y, th)]
    for i in range(1, len(enc)):
        dl = (enc[i][0] - enc[i - 1][0]) * k
        dr = (enc[i][1] - enc[i - 1][1]) * k * s_right
        dth = (dr - dl) / b
        x += (dl + dr) / 2 * math.cos(th + dth / 2)
        y += (dl + dr) / 2 * math.sin(th + dth / 2)
        th += dth
        out.append((x, y, th))
    return out


def errors(robot, poses, gt, keep):
    e = [(poses[int(round(t * robot["encoder_rate_hz"]))][0] - x) ** 2
         + (poses[int(round(t * robot["encoder_rate_hz"]))][1] - y) ** 2 for t, x, y in gt if keep(t)]
    return math.sqrt(sum(e) / len(e))


def reference():
    robot, enc, gt = load()
    cal = lambda t: t <= 40.0  # noqa: E731
    # ternary search on the calibration RMSE (unimodal near the optimum)
    lo, hi = 0.98, 1.02
    while hi - lo > 1e-7:
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if errors(robot, dead_reckon(robot, enc, m1), gt, cal) < errors(robot, dead_reckon(robot, enc, m2), gt, cal):
            hi = m2
        else:
            lo = m1
    s = (lo + hi) / 2
    out = {"scale_right": s}
    for name, sc in (("raw", 1.0), ("calibrated", s)):
        p = dead_reckon(robot, enc, sc)
        out[name] = {"final_pose": p[-1], "rmse_all": errors(robot, p, gt, lambda t: True),
                     "rmse_calib": errors(robot, p, gt, cal), "rmse_holdout": errors(robot, p, gt, lambda t: t > 40.0)}
    raw = dead_reckon(robot, enc, 1.0)
    out["path_length_m"] = sum(math.hypot(b[0] - a[0], b[1] - a[1]) for a, b in zip(raw, raw[1:]))
    return out


def check_pose(name, got, want):
    if not isinstance(got, list) or len(got) != 3 or any(num(v) is None for v in got):
        check(name, False, f"expected [x, y, theta], got {short(got)}")
        return
    dpos = math.hypot(got[0] - want[0], got[1] - want[1])
    dth = abs(math.atan2(math.sin(got[2] - want[2]), math.cos(got[2] - want[2])))
    check(name, dpos <= 1e-3 and dth <= 1e-4,
          f"position off by {dpos:.2e} m, heading off by {dth:.2e} rad (tolerance 1e-3 m, 1e-4 rad); "
          f"expected ({want[0]:.4f}, {want[1]:.4f}, {math.atan2(math.sin(want[2]), math.cos(want[2])):.4f})")


def main():
    check_deliverables()
    check_protected()
    ref = reference()
    res, err = load_json("results.json")
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        check_num("results:path_length_m", get(res, "path_length_m"), ref["path_length_m"], 1e-4, 0.0)
        check_num("results:calibrated.scale_right", get(res, "calibrated", "scale_right"), ref["scale_right"], 0.0, 5e-5)
        for name in ("raw", "calibrated"):
            check_pose(f"results:{name}.final_pose", get(res, name, "final_pose"), ref[name]["final_pose"])
            for key in ("rmse_all", "rmse_calib", "rmse_holdout"):
                check_num(f"results:{name}.{key}", get(res, name, key), ref[name][key], 0.01, 5e-4)
    check_report(read_text("report.md"), 400, [
        ("calibrated right-wheel scale", ref["scale_right"], 0.0, 6e-5),
        ("raw hold-out RMSE", ref["raw"]["rmse_holdout"], 0.01, 0.0),
    ])
    check_logs(3)


if __name__ == "__main__":
    run(main)
