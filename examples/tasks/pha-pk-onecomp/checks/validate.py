#!/usr/bin/env python3
"""Validator for pha-pk-onecomp.

Run from the workspace root:  python3 checks/validate.py
Recomputes, per subject, the log-linear elimination constant (BLQ samples
excluded), AUC(0-tlast) by the linear trapezoid from (0, C0), AUC(0-inf), the
extrapolated fraction, CL, V and t1/2, plus the geometric-mean population summary,
and compares results.json.
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
    "data/plasma.csv": "e7786c92be828ab21fd4c22427fda4aff72eaa29c760b02d0c1f0ff4753c7f8c",
    "data/study.json": "fbfbcfdd6b4976f7112f00fac88584c3e21e07907c334cd5e861bc23b5d37a68",
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


def reference():
    with open("data/study.json") as f:
        dose = float(json.load(f)["dose_mg"])
    prof = {}
    with open("data/plasma.csv", newline="") as f:
        for r in csv.DictReader(f):
            v = r["conc_mg_L"].strip()
            if v.upper() != "BLQ":
                prof.setdefault(r["subject"], []).append((float(r["time_h"]), float(v)))
    out = {}
    for sid, pts in prof.items():
        pts.sort()
        n = len(pts)
        tb = sum(t for t, _ in pts) / n
        yb = sum(math.log(c) for _, c in pts) / n
        b = sum((t - tb) * (math.log(c) - yb) for t, c in pts) / sum((t - tb) ** 2 for t, _ in pts)
        k = -b
        c0 = math.exp(yb - b * tb)
        full = [(0.0, c0)] + pts
        auct = sum((full[i + 1][0] - full[i][0]) * (full[i + 1][1] + full[i][1]) / 2 for i in range(n))
        aucinf = auct + pts[-1][1] / k
        out[sid] = {"k_el_per_h": k, "half_life_h": math.log(2) / k, "c0_mg_L": c0, "auc_0_tlast": auct,
                    "auc_0_inf": aucinf, "pct_auc_extrapolated": 100 * (pts[-1][1] / k) / aucinf,
                    "cl_L_per_h": dose / aucinf, "vd_L": dose / aucinf / k}
    pop = {}
    for key in ("cl_L_per_h", "vd_L", "half_life_h"):
        lg = [math.log(o[key]) for o in out.values()]
        s = statistics.stdev(lg)
        pop[key] = {"geo_mean": math.exp(statistics.fmean(lg)), "geo_cv_pct": 100 * math.sqrt(math.exp(s * s) - 1)}
    return out, pop


TOL = {"k_el_per_h": (1e-4, 0.0), "half_life_h": (1e-4, 0.0), "c0_mg_L": (1e-4, 0.0), "auc_0_tlast": (1e-4, 0.0),
       "auc_0_inf": (1e-4, 0.0), "pct_auc_extrapolated": (0.0, 0.05), "cl_L_per_h": (1e-4, 0.0), "vd_L": (1e-4, 0.0)}


def main():
    check_deliverables()
    check_protected()
    subs, pop = reference()
    res, err = load_json("results.json")
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        for sid, ref in sorted(subs.items()):
            bad = []
            for key, (rel, abs_) in TOL.items():
                g = num(get(res, "subjects", sid, key))
                if g is None or abs(g - ref[key]) > max(abs_, rel * abs(ref[key])):
                    bad.append(f"{key}={short(get(res, 'subjects', sid, key), 14)} (expected {ref[key]:.5g})")
            check(f"subject:{sid}", not bad, "all parameters match" if not bad else "; ".join(bad[:4]))
        for key, ref in pop.items():
            check_num(f"population:{key}.geo_mean", get(res, "population", key, "geo_mean"), ref["geo_mean"], 1e-3, 0.0)
            check_num(f"population:{key}.geo_cv_pct", get(res, "population", key, "geo_cv_pct"), ref["geo_cv_pct"], 0.0, 0.3)
    worst = max(subs, key=lambda s: subs[s]["pct_auc_extrapolated"])
    check_report(read_text("report.md"), 400, [
        ("population geometric-mean CL", pop["cl_L_per_h"]["geo_mean"], 0.01, 0.0),
        (f"% AUC extrapolated for {worst}", subs[worst]["pct_auc_extrapolated"], 0.0, 0.6),
    ])
    check_logs(3)


if __name__ == "__main__":
    run(main)
