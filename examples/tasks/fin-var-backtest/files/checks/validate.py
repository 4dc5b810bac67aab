#!/usr/bin/env python3
"""Validator for fin-var-backtest.

Run from the workspace root:  python3 checks/validate.py
Recomputes the rolling 250-day 99% historical-simulation VaR (3rd smallest of the
previous 250 returns), the exceedances, Kupiec's POF test and Christoffersen's
independence test from data/returns.csv and compares results.json.
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
    "data/returns.csv": "d2dcb4cd0f094c551ff72eb523c38cc54241f223e7ca7bb76c3efeca8214ab09",
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

W, K, P = 250, 3, 0.01


def ll(k, n, p):
    out = 0.0
    if k:
        out += k * math.log(p)
    if n - k:
        out += (n - k) * math.log(1 - p)
    return out


def reference():
    with open("data/returns.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    dates = [r["date"] for r in rows]
    x = [float(r["ret"]) for r in rows]
    vs, hits = [], []
    for t in range(W, len(x)):
        v = -sorted(x[t - W:t])[K - 1]
        vs.append(v)
        hits.append(x[t] < -v)
    n, e = len(hits), sum(hits)
    lr_pof = 2 * (ll(e, n, e / n) - ll(e, n, P))
    t = {(a, b): 0 for a in (False, True) for b in (False, True)}
    for a, b in zip(hits, hits[1:]):
        t[(a, b)] += 1
    n0, n1 = t[(False, False)] + t[(False, True)], t[(True, False)] + t[(True, True)]
    lr_ind = 2 * (ll(t[(False, True)], n0, t[(False, True)] / n0)
                  + (ll(t[(True, True)], n1, t[(True, True)] / n1) if n1 else 0.0)
                  - ll(t[(False, True)] + t[(True, True)], n0 + n1, (t[(False, True)] + t[(True, True)]) / (n0 + n1)))
    return {"n_days": n, "exceedances": e, "dates": [dates[W + i] for i, h in enumerate(hits) if h],
            "mean_var": sum(vs) / n, "max_var": max(vs),
            "lr_pof": lr_pof, "p_pof": math.erfc(math.sqrt(lr_pof / 2)),
            "lr_ind": lr_ind, "p_ind": math.erfc(math.sqrt(lr_ind / 2))}


def main():
    check_deliverables()
    check_protected()
    ref = reference()
    res, err = load_json("results.json")
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        check_int("results:n_days", get(res, "n_days"), ref["n_days"])
        check_int("results:exceedances", get(res, "exceedances"), ref["exceedances"])
        got_dates = get(res, "exceedance_dates")
        ok = isinstance(got_dates, list) and sorted(str(d) for d in got_dates) == ref["dates"]
        check("results:exceedance_dates", ok, "dates match" if ok else
              f"expected {len(ref['dates'])} dates starting {ref['dates'][:2]}, got {short(got_dates, 60)}")
        check_num("results:mean_var", get(res, "mean_var"), ref["mean_var"], 1e-3, 0.0)
        check_num("results:max_var", get(res, "max_var"), ref["max_var"], 1e-3, 0.0)
        check_num("results:kupiec.lr", get(res, "kupiec", "lr"), ref["lr_pof"], 0.0, 0.01)
        check_num("results:kupiec.p_value", get(res, "kupiec", "p_value"), ref["p_pof"], 0.0, 0.003)
        check_num("results:christoffersen_ind.lr", get(res, "christoffersen_ind", "lr"), ref["lr_ind"], 0.0, 0.01)
        check_num("results:christoffersen_ind.p_value", get(res, "christoffersen_ind", "p_value"), ref["p_ind"], 0.0, 0.003)
    check_report(read_text("report.md"), 400, [
        ("Kupiec p-value", ref["p_pof"], 0.0, 0.006),
        ("independence p-value", ref["p_ind"], 0.0, 0.006),
        ("mean VaR", ref["mean_var"], 0.02, 0.0),
    ])
    check_logs(3)


if __name__ == "__main__":
    run(main)
