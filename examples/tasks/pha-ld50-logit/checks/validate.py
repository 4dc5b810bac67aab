#!/usr/bin/env python3
"""Validator for pha-ld50-logit.

Run from the workspace root:  python3 checks/validate.py
Refits the binomial logistic model logit(p) = a + b log10(dose) to
data/mortality.csv by maximum likelihood (iteratively reweighted least squares),
recomputes LD50 with its delta-method 95 % interval on the log scale, LD10, LD90,
Pearson chi-square, deviance and the GHS category of the point estimate, and
compares results.json.
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
    "data/mortality.csv": "494f2dafd872e96a603a171b2a418cf32159b73e012ec588d6f19e7da4b74619",
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


def reference():
    with open("data/mortality.csv", newline="") as f:
        rows = [(math.log10(float(r["dose_mg_kg"])), int(r["n_animals"]), int(r["n_dead"])) for r in csv.DictReader(f)]
    a, b = 0.0, 0.0
    for _ in range(200):  # IRLS
        sw = swx = swxx = swz = swxz = 0.0
        for x, n, k in rows:
            eta = a + b * x
            p = 1 / (1 + math.exp(-eta))
            w = n * p * (1 - p)
            z = eta + (k - n * p) / w
            sw, swx, swxx, swz, swxz = sw + w, swx + w * x, swxx + w * x * x, swz + w * z, swxz + w * x * z
        det = sw * swxx - swx * swx
        na, nb = (swxx * swz - swx * swxz) / det, (sw * swxz - swx * swz) / det
        done = abs(na - a) + abs(nb - b) < 1e-13
        a, b = na, nb
        if done:
            break
    sw = swx = swxx = 0.0
    for x, n, k in rows:
        p = 1 / (1 + math.exp(-(a + b * x)))
        w = n * p * (1 - p)
        sw, swx, swxx = sw + w, swx + w * x, swxx + w * x * x
    det = sw * swxx - swx * swx
    va, vb, cab = swxx / det, sw / det, -swx / det
    m = -a / b
    se_m = math.sqrt((va + 2 * m * cab + m * m * vb) / (b * b))
    chi2 = dev = 0.0
    for x, n, k in rows:
        p = 1 / (1 + math.exp(-(a + b * x)))
        chi2 += (k - n * p) ** 2 / (n * p * (1 - p))
        if k:
            dev += 2 * k * math.log(k / (n * p))
        if n - k:
            dev += 2 * (n - k) * math.log((n - k) / (n * (1 - p)))
    ld50 = 10 ** m
    cat = next((c for lim, c in ((5, 1), (50, 2), (300, 3), (2000, 4), (5000, 5)) if ld50 <= lim), None)
    return {"a": a, "b": b, "se_a": math.sqrt(va), "se_b": math.sqrt(vb), "ld50": ld50,
            "ci": (10 ** (m - 1.959964 * se_m), 10 ** (m + 1.959964 * se_m)),
            "ld10": 10 ** ((math.log(1 / 9) - a) / b), "ld90": 10 ** ((math.log(9) - a) / b),
            "chi2": chi2, "dev": dev, "df": len(rows) - 2, "cat": cat}


def main():
    check_deliverables()
    check_protected()
    ref = reference()
    res, err = load_json("results.json")
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        check_num("results:a", get(res, "a"), ref["a"], 1e-4, 0.0)
        check_num("results:b", get(res, "b"), ref["b"], 1e-4, 0.0)
        check_num("results:se_b", get(res, "se_b"), ref["se_b"], 1e-3, 0.0)
        check_num("results:ld50_mg_kg", get(res, "ld50_mg_kg"), ref["ld50"], 1e-4, 0.0)
        check_num("results:ld50_ci95_mg_kg.lower", get(res, "ld50_ci95_mg_kg", 0), ref["ci"][0], 1e-3, 0.0)
        check_num("results:ld50_ci95_mg_kg.upper", get(res, "ld50_ci95_mg_kg", 1), ref["ci"][1], 1e-3, 0.0)
        check_num("results:ld10_mg_kg", get(res, "ld10_mg_kg"), ref["ld10"], 1e-3, 0.0)
        check_num("results:ld90_mg_kg", get(res, "ld90_mg_kg"), ref["ld90"], 1e-3, 0.0)
        check_num("results:pearson_chi2", get(res, "pearson_chi2"), ref["chi2"], 0.0, 2e-3)
        check_num("results:deviance", get(res, "deviance"), ref["dev"], 0.0, 2e-3)
        check_int("results:df", get(res, "df"), ref["df"])
        check_int("results:ghs_category_point", get(res, "ghs_category_point"), ref["cat"])
    check_report(read_text("report.md"), 400, [
        ("LD50 (mg/kg)", ref["ld50"], 0.002, 0.0),
        ("lower 95 % limit of LD50", ref["ci"][0], 0.003, 0.0),
        ("upper 95 % limit of LD50", ref["ci"][1], 0.003, 0.0),
    ])
    check_logs(3)


if __name__ == "__main__":
    run(main)
