#!/usr/bin/env python3
"""Validator for fin-minvar-portfolio.

Run from the workspace root:  python3 checks/validate.py
Re-estimates the sample covariance on the first 504 days of data/returns.csv,
recomputes the global minimum-variance weights and the in-/out-of-sample
volatilities, and compares results.json. Exit 0 = all pass, 1 = a check failed,
2 = a deliverable is missing.
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
    "data/returns.csv": "5e0aee9938949c9226b404df1da9ab4eae296f5149c4d6aaa38a718e44cf1c50",
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
import statistics

N_IN = 504


def reference():
    with open("data/returns.csv", newline="") as f:
        rd = csv.reader(f)
        assets = next(rd)[1:]
        rows = [[float(x) for x in r[1:]] for r in rd]
    ins, oos = rows[:N_IN], rows[N_IN:]
    k = len(assets)
    cols = list(zip(*ins))
    mean = [statistics.fmean(c) for c in cols]
    cov = [[sum((a - mean[i]) * (b - mean[j]) for a, b in zip(cols[i], cols[j])) / (N_IN - 1)
            for j in range(k)] for i in range(k)]
    # invert via Gauss-Jordan, then w = S^-1 1 / sum
    aug = [cov[i][:] + [1.0 if i == j else 0.0 for j in range(k)] for i in range(k)]
    for c in range(k):
        p = max(range(c, k), key=lambda r: abs(aug[r][c]))
        aug[c], aug[p] = aug[p], aug[c]
        piv = aug[c][c]
        aug[c] = [x / piv for x in aug[c]]
        for r in range(k):
            if r != c:
                f = aug[r][c]
                aug[r] = [x - f * y for x, y in zip(aug[r], aug[c])]
    inv = [row[k:] for row in aug]
    raw = [sum(row) for row in inv]
    w = [x / sum(raw) for x in raw]

    def vol(rs, ww):
        return statistics.stdev([sum(a * b for a, b in zip(ww, r)) for r in rs]) * 252 ** 0.5

    ew = [1.0 / k] * k
    out = {"assets": assets, "weights": dict(zip(assets, w)),
           "insample": {"vol_minvar": vol(ins, w), "vol_equal": vol(ins, ew)},
           "oos": {"vol_minvar": vol(oos, w), "vol_equal": vol(oos, ew)}}
    out["risk_reduction_oos"] = 1 - out["oos"]["vol_minvar"] / out["oos"]["vol_equal"]
    out["risk_reduction_insample"] = 1 - out["insample"]["vol_minvar"] / out["insample"]["vol_equal"]
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
        ws = get(res, "weights")
        vals = [num(get(ws, a)) for a in ref["assets"]]
        check("results:weights_sum", all(v is not None for v in vals) and abs(sum(vals) - 1) < 1e-6,
              f"weights sum to {sum(v for v in vals if v is not None):.6f} (must be 1)")
        for a in ref["assets"]:
            check_num(f"results:weights.{a}", get(ws, a), ref["weights"][a], 0.0, 2e-3)
        for win in ("insample", "oos"):
            for key in ("vol_minvar", "vol_equal"):
                check_num(f"results:{win}.{key}", get(res, win, key), ref[win][key], 0.0, 5e-4)
        check_num("results:risk_reduction_oos", get(res, "risk_reduction_oos"), ref["risk_reduction_oos"], 0.0, 3e-3)
    report = read_text("report.md")
    if report is not None:
        missing = [a for a in ref["assets"] if a not in report]
        check("report:assets", not missing, "all assets named" if not missing else f"assets not named: {missing}")
    big = max(ref["assets"], key=lambda a: abs(ref["weights"][a]))
    check_report(report, 400, [
        (f"weight of {big}", ref["weights"][big], 0.01, 0.0),
        ("in-sample GMV volatility", ref["insample"]["vol_minvar"], 0.01, 0.0),
    ])
    check_logs(3)


if __name__ == "__main__":
    run(main)
