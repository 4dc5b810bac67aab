#!/usr/bin/env python3
"""Validator for pha-arrhenius-shelf-life.

Run from the workspace root:  python3 checks/validate.py
Recomputes first-order rate constants per temperature from data/stability.csv,
the Arrhenius fit (1/T in kelvin), the predicted k and t90 = ln(10/9)/k at 25 C
and 30 C, and the 95 % conservative bound at 25 C, then compares results.json.
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
    "data/stability.csv": "0f3525849c8e4851ca25b74ad46b70525b0c7a9fccb7e285962ed0094aeac3bf",
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

GAS_R = 8.314462618
T_975_2 = 4.302652729911275


def line(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    s = math.sqrt(sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / (n - 2))
    return a, b, s, mx, sxx


def reference():
    groups = {}
    with open("data/stability.csv", newline="") as f:
        for r in csv.DictReader(f):
            groups.setdefault(int(r["temp_C"]), []).append((float(r["time_days"]), float(r["assay_pct"])))
    ks = {}
    for temp, pts in groups.items():
        ks[temp] = -line([t for t, _ in pts], [math.log(y) for _, y in pts])[1]
    temps = sorted(ks)
    a, b, s, mx, sxx = line([1 / (t + 273.15) for t in temps], [math.log(ks[t]) for t in temps])
    out = {"k": ks, "ea_kJ_mol": -b * GAS_R / 1000}
    for tc in (25, 30):
        x0 = 1 / (tc + 273.15)
        out[f"k{tc}"] = math.exp(a + b * x0)
        out[f"t90_{tc}"] = math.log(10 / 9) / out[f"k{tc}"]
        if tc == 25:
            se = s * math.sqrt(1 / len(temps) + (x0 - mx) ** 2 / sxx)
            out["t90_25_lower"] = math.log(10 / 9) / math.exp(a + b * x0 + T_975_2 * se)
    return out


def main():
    check_deliverables()
    check_protected()
    ref = reference()
    res, err = load_json("results.json")
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        for temp, k in sorted(ref["k"].items()):
            check_num(f"results:k_per_day.{temp}", get(res, "k_per_day", str(temp)), k, 1e-4, 0.0)
        check_num("results:ea_kJ_mol", get(res, "ea_kJ_mol"), ref["ea_kJ_mol"], 0.0, 0.05)
        check_num("results:k25_per_day", get(res, "k25_per_day"), ref["k25"], 1e-3, 0.0)
        check_num("results:t90_25C_days", get(res, "t90_25C_days"), ref["t90_25"], 1e-3, 0.0)
        check_num("results:t90_25C_months", get(res, "t90_25C_months"), ref["t90_25"] / 30.4375, 1e-3, 0.0)
        check_num("results:t90_30C_days", get(res, "t90_30C_days"), ref["t90_30"], 1e-3, 0.0)
        check_num("results:t90_25C_lower95_days", get(res, "t90_25C_lower95_days"), ref["t90_25_lower"], 2e-3, 0.0)
    check_report(read_text("report.md"), 400, [
        ("activation energy (kJ/mol)", ref["ea_kJ_mol"], 0.0, 0.06),
        ("t90 at 25 C (months)", ref["t90_25"] / 30.4375, 0.0, 0.06),
    ])
    check_logs(3)


if __name__ == "__main__":
    run(main)
