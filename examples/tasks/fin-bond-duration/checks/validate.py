#!/usr/bin/env python3
"""Validator for fin-bond-duration.

Run from the workspace root:  python3 checks/validate.py
Re-solves each bond's yield (semiannual bond-equivalent) from data/bonds.csv,
recomputes durations, convexity, DV01, the +100 bp repricing and the portfolio
aggregates from data/portfolio.csv, and compares results.json.
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
    "data/bonds.csv": "56f43d4292ae090142d6b74c62943f4a5fbe5f532166ff0492121a398e21f1a0",
    "data/portfolio.csv": "240dcce59bd5f40b9f217b674e9274803a762e17845764b3513f9f9e197fea7d",
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


def flows(coupon, maturity):
    n = int(round(maturity * 2))
    return [(k, coupon / 2 + (100.0 if k == n else 0.0)) for k in range(1, n + 1)]


def pv(cfs, y):
    return sum(c * (1 + y / 2) ** -k for k, c in cfs)


def reference():
    with open("data/bonds.csv", newline="") as f:
        bonds = list(csv.DictReader(f))
    with open("data/portfolio.csv", newline="") as f:
        face = {r["bond_id"]: float(r["face_value"]) for r in csv.DictReader(f)}
    out = {}
    for r in bonds:
        cfs = flows(float(r["coupon_pct"]), float(r["maturity_years"]))
        px = float(r["price"])
        y = 0.04
        for _ in range(100):  # Newton on the price equation
            f0 = pv(cfs, y) - px
            d1 = sum(-k / 2 * c * (1 + y / 2) ** (-k - 1) for k, c in cfs)
            step = f0 / d1
            y -= step
            if abs(step) < 1e-15:
                break
        p = pv(cfs, y)
        mac = sum(k / 2 * c * (1 + y / 2) ** -k for k, c in cfs) / p
        mod = mac / (1 + y / 2)
        conv = sum(c * k * (k + 1) / 4 * (1 + y / 2) ** (-k - 2) for k, c in cfs) / p
        out[r["bond_id"]] = {"price": px, "ytm": y, "macaulay_duration": mac, "modified_duration": mod,
                             "convexity": conv, "dv01": mod * px / 1e4, "price_up100_exact": pv(cfs, y + 0.01),
                             "price_up100_duration": px * (1 - mod * 0.01),
                             "price_up100_dur_conv": px * (1 - mod * 0.01 + 0.5 * conv * 1e-4)}
    mv = sum(face[i] / 100 * out[i]["price"] for i in out)
    dv01 = sum(face[i] / 100 * out[i]["dv01"] for i in out)
    port = {"market_value": mv, "dv01": dv01, "modified_duration": dv01 / mv * 1e4,
            "pnl_up100_exact": sum(face[i] / 100 * (out[i]["price_up100_exact"] - out[i]["price"]) for i in out),
            "pnl_up100_duration": sum(face[i] / 100 * (out[i]["price_up100_duration"] - out[i]["price"]) for i in out)}
    return out, port


TOL = {"ytm": (0.0, 2e-6), "macaulay_duration": (0.0, 2e-3), "modified_duration": (0.0, 2e-3),
       "convexity": (2e-3, 0.0), "dv01": (1e-3, 0.0), "price_up100_exact": (0.0, 2e-3),
       "price_up100_duration": (0.0, 3e-3), "price_up100_dur_conv": (0.0, 3e-3)}


def main():
    check_deliverables()
    check_protected()
    bonds, port = reference()
    res, err = load_json("results.json")
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        for bid, ref in bonds.items():
            bad = []
            for key, (rel, abs_) in TOL.items():
                g = num(get(res, "bonds", bid, key))
                if g is None or abs(g - ref[key]) > max(abs_, rel * abs(ref[key])):
                    bad.append(f"{key}={short(get(res, 'bonds', bid, key), 14)} (expected {ref[key]:.6g})")
            check(f"results:bonds.{bid}", not bad, "all analytics match" if not bad else "; ".join(bad[:4]))
        for key, rel in (("market_value", 1e-6), ("dv01", 1e-3), ("modified_duration", 1e-3),
                         ("pnl_up100_exact", 1e-3), ("pnl_up100_duration", 1e-3)):
            check_num(f"results:portfolio.{key}", get(res, "portfolio", key), port[key], rel, 0.0)
    check_report(read_text("report.md"), 400, [
        ("portfolio DV01", port["dv01"], 0.01, 0.0),
        ("exact +100bp portfolio P&L", port["pnl_up100_exact"], 0.01, 0.0),
        ("T30Y modified duration", bonds["T30Y"]["modified_duration"], 0.0, 0.01),
    ])
    check_logs(3)


if __name__ == "__main__":
    run(main)
