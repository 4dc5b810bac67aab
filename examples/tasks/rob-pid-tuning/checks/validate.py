#!/usr/bin/env python3
"""Validator for rob-pid-tuning.

Run from the workspace root:  python3 checks/validate.py
Re-simulates the reported PID gains on an embedded copy of sim/motor.py (which
must itself be unmodified), recomputes the step-response metrics, compares them
with results.json and checks the nominal requirements (overshoot <= 2 %, 2 %
settling <= 0.25 s, final error <= 1e-3 rad). Robustness to inertia changes is
asked for in the report but is NOT machine-checked.
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
    "sim/motor.py": "a376346501eb7d21e363efd7e6a28182660fd51d45db8542a71a09fb23108635",
    "sim/__init__.py": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
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
# Embedded copy of the provided simulator (sim/motor.py), so a modified
# simulator in the workspace cannot change the verdict.
DT, SUBSTEPS, V_MAX, DELAY = 0.002, 4, 12.0, 5
PARAMS = {"J": 0.02, "b": 0.05, "Kt": 0.6, "Ke": 0.6, "R": 2.0, "tau_load": 0.3}


def simulate(kp, ki, kd, T=3.0, setpoint=1.0, inertia_scale=1.0):
    p = dict(PARAMS)
    J = p["J"] * inertia_scale
    h = DT / SUBSTEPS
    theta = omega = integ = 0.0
    meas = [0.0] * (DELAY + 1)
    prev_y = 0.0
    ts, ths, us = [], [], []
    n = int(round(T / DT))
    for k in range(n + 1):
        t = k * DT
        meas = meas[1:] + [theta]
        y = meas[0]
        e = setpoint - y
        deriv = -(y - prev_y) / DT if k > 0 else 0.0
        prev_y = y
        u_unsat = kp * e + ki * integ + kd * deriv
        u = max(-V_MAX, min(V_MAX, u_unsat))
        if u == u_unsat or (u_unsat > V_MAX and e < 0) or (u_unsat < -V_MAX and e > 0):
            integ += e * DT
        ts.append(t)
        ths.append(theta)
        us.append(u)
        for _ in range(SUBSTEPS):
            torque = p["Kt"] / p["R"] * (u - p["Ke"] * omega) - p["b"] * omega - p["tau_load"]
            omega += h * torque / J
            theta += h * omega
    return ts, ths, us


def step_metrics(kp, ki, kd):
    t, th, u = simulate(kp, ki, kd)
    if not all(math.isfinite(x) for x in th):
        return None
    settle = 0.0
    for k in range(len(th) - 1, -1, -1):
        if abs(th[k] - 1.0) > 0.02:
            settle = t[min(k + 1, len(t) - 1)]
            break
    t10 = next((tt for tt, x in zip(t, th) if x >= 0.1), None)
    t90 = next((tt for tt, x in zip(t, th) if x >= 0.9), None)
    return {"overshoot_pct": max(0.0, max(th) - 1.0) * 100.0, "settling_time_s": settle,
            "rise_time_s": (t90 - t10) if t10 is not None and t90 is not None else None,
            "steady_state_error": abs(1.0 - th[-1]), "peak_voltage": max(abs(x) for x in u)}


SPEC = {"overshoot_pct": 2.0, "settling_time_s": 0.25, "steady_state_error": 1e-3}
TOL = {"overshoot_pct": 0.02, "settling_time_s": 0.0021, "rise_time_s": 0.0021,
       "steady_state_error": 2e-5, "peak_voltage": 0.01}


def main():
    check_deliverables()
    check_protected()
    res, err = load_json("results.json")
    gains = None
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        g = [num(get(res, "gains", k)) for k in ("kp", "ki", "kd")]
        ok = all(x is not None and 0.0 <= x <= 1000.0 for x in g)
        check("results:gains", ok, f"kp, ki, kd = {g}" if ok else
              f"gains must be numbers in [0, 1000], got {short(get(res, 'gains'))}")
        if ok:
            gains = g
    m = step_metrics(*gains) if gains else None
    if gains and m is None:
        check("sim:stable", False, "the closed loop diverges with these gains")
    if m is not None:
        for key, tol in TOL.items():
            if m[key] is None:
                check(f"results:nominal.{key}", False, "response never reaches 90 %")
            else:
                check_num(f"results:nominal.{key}", get(res, "nominal", key), m[key], 0.0, tol)
        for key, limit in SPEC.items():
            check(f"spec:{key}", m[key] <= limit, f"re-simulated {m[key]:.4g} (requirement <= {limit:g})")
        all_ok = all(m[k] <= v for k, v in SPEC.items())
        check("results:meets_spec", get(res, "meets_spec") is all_ok,
              f"reported {short(get(res, 'meets_spec'))}, re-simulation says {all_ok}")
    check_report(read_text("report.md"), 400,
                 [("kp", gains[0], 0.0, 1e-6), ("nominal settling time", m["settling_time_s"], 0.0, 0.0011)]
                 if gains and m else [])
    check_logs(3)


if __name__ == "__main__":
    run(main)
