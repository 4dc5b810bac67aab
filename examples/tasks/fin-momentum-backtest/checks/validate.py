#!/usr/bin/env python3
"""Validator for fin-momentum-backtest.

Run from the workspace root:  python3 checks/validate.py
Recomputes the SMA20/SMA100 long/flat backtest (signal at close t-1 sets the
position for day t, 10 bps per unit turnover) from data/prices.csv and compares
results.json; checks that report.md states the key numbers and logs.txt exists.
Exit 0 = all checks pass, 1 = some check failed, 2 = a deliverable is missing.
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
    "data/prices.csv": "7b12b57485703ff3223cf5006e4dceff8495cab41d2bba9728d9a32604f5c1d4",
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

FAST, SLOW, COST = 20, 100, 10.0 / 1e4


def reference():
    with open("data/prices.csv", newline="") as f:
        closes = [float(r["close"]) for r in csv.DictReader(f)]
    n = len(closes)

    def sma(t, w):
        return sum(closes[t - w + 1: t + 1]) / w

    strat, bh = [], []
    prev = 0
    trades = 0
    longs = 0
    for t in range(SLOW, n):
        pos = 1 if sma(t - 1, FAST) > sma(t - 1, SLOW) else 0
        r = closes[t] / closes[t - 1] - 1.0
        trades += pos != prev
        longs += pos
        strat.append(pos * r - COST * abs(pos - prev))
        bh.append(r)
        prev = pos

    def summary(rets):
        eq = peak = 1.0
        mdd = 0.0
        for r in rets:
            eq *= 1 + r
            peak = max(peak, eq)
            mdd = max(mdd, 1 - eq / peak)
        sd = statistics.stdev(rets)
        return {"total_return": eq - 1, "sharpe": statistics.fmean(rets) / sd * 252 ** 0.5,
                "max_drawdown": mdd, "ann_vol": sd * 252 ** 0.5,
                "cagr": eq ** (252.0 / len(rets)) - 1}

    s = summary(strat)
    s["n_trades"] = trades
    s["exposure"] = longs / len(strat)
    return s, summary(bh), n - SLOW


def main():
    check_deliverables()
    check_protected()
    want_s, want_b, n_eval = reference()
    res, err = load_json("results.json")
    if res is None:
        check("results:json", False, f"results.json {err}")
    else:
        check("results:json", isinstance(res, dict), "results.json parsed" if isinstance(res, dict) else "top level is not an object")
        check_int("results:eval_days", get(res, "eval_days"), n_eval)
        for key, rel, abs_ in (("total_return", 0.0, 1e-3), ("sharpe", 0.0, 5e-3), ("max_drawdown", 0.0, 1e-3),
                               ("ann_vol", 0.0, 1e-3), ("cagr", 0.0, 1e-3)):
            check_num(f"results:strategy.{key}", get(res, "strategy", key), want_s[key], rel, abs_)
        check_int("results:strategy.n_trades", get(res, "strategy", "n_trades"), want_s["n_trades"])
        check_num("results:strategy.exposure", get(res, "strategy", "exposure"), want_s["exposure"], 0.0, 2e-3)
        for key in ("total_return", "sharpe", "max_drawdown"):
            check_num(f"results:buy_and_hold.{key}", get(res, "buy_and_hold", key), want_b[key], 0.0, 5e-3 if key == "sharpe" else 1e-3)
    report = read_text("report.md")
    check_report(report, 400, [
        ("strategy Sharpe", want_s["sharpe"], 0.0, 0.006),
        ("buy-and-hold Sharpe", want_b["sharpe"], 0.0, 0.006),
        ("strategy max drawdown", want_s["max_drawdown"], 0.01, 0.0),
    ])
    check_logs(3)


if __name__ == "__main__":
    run(main)
