#!/usr/bin/env python3
"""Validator for pha-hill-fit.

Run from the workspace root:  python3 checks/validate.py
Refits the 4-parameter Hill model to every replicate in data/dose_response.csv
with an independent Levenberg-Marquardt optimiser (several starts), recomputes the
asymptotic standard errors, and compares results.json: the reported parameters
must reach the least-squares minimum and match the refit.
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
    "data/dose_response.csv": "67e5e8dd5cc1f931af990940017ca3a1b0bd51aa85c8d8a76810ff4830d1a516",
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

LN10 = math.log(10)


def f_hill(c, p):
    return p[0] + (p[1] - p[0]) / (1 + 10 ** (p[3] * (p[2] - math.log10(c))))


def grad(c, p):
    lc = math.log10(c)
    g = 1 / (1 + 10 ** (p[3] * (p[2] - lc)))
    d = -(p[1] - p[0]) * LN10 * g * (1 - g)
    return [1 - g, g, d * p[3], d * (p[2] - lc)]


def solve4(a, b):
    n = len(b)
    m = [a[i][:] + [b[i]] for i in range(n)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[piv] = m[piv], m[c]
        for r in range(c + 1, n):
            fct = m[r][c] / m[c][c]
            for j in range(c, n + 1):
                m[r][j] -= fct * m[c][j]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return x


def sse(data, p):
    try:
        return sum((y - f_hill(c, p)) ** 2 for c, y in data)
    except (OverflowError, ZeroDivisionError, ValueError):
        return float("inf")


def levmar(data, p):
    lam = 1e-3
    cur = sse(data, p)
    for _ in range(500):
        J = [grad(c, p) for c, _ in data]
        r = [y - f_hill(c, p) for c, y in data]
        jtj = [[sum(row[i] * row[j] for row in J) for j in range(4)] for i in range(4)]
        jtr = [sum(row[i] * ri for row, ri in zip(J, r)) for i in range(4)]
        improved = False
        while lam < 1e12:
            a = [[jtj[i][j] * (1 + lam if i == j else 1) for j in range(4)] for i in range(4)]
            try:
                step = solve4(a, jtr)
            except ZeroDivisionError:
                lam *= 10
                continue
            q = [pi + si for pi, si in zip(p, step)]
            new = sse(data, q)
            if new < cur:
                done = cur - new < 1e-14 * (1 + cur)
                p, cur, lam, improved = q, new, max(lam / 10, 1e-12), True
                break
            lam *= 10
        if not improved or done:
            break
    return p, cur


def reference(data):
    best = None
    for lec in (-3, -2, -1, 0, 1, 2):
        for n in (0.7, 1.0, 1.5, 2.5):
            p, s = levmar(data, [0.0, 100.0, float(lec), n])
            if best is None or s < best[1]:
                best = (p, s)
    p, s = best
    J = [grad(c, p) for c, _ in data]
    jtj = [[sum(row[i] * row[j] for row in J) for j in range(4)] for i in range(4)]
    s2 = s / (len(data) - 4)
    se = []
    for k in range(4):
        e = [1.0 if i == k else 0.0 for i in range(4)]
        se.append(math.sqrt(s2 * solve4(jtj, e)[k]))
    return p, s, se


def main():
    check_deliverables()
    check_protected()
    data = {}
    with open("data/dose_response.csv", newline="") as f:
        for r in csv.DictReader(f):
            data.setdefault(r["compound"], []).append((float(r["conc_uM"]), float(r["response_pct"])))
    refs = {k: reference(v) for k, v in sorted(data.items())}
    res, err = load_json("results.json")
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        for comp, (p, s_min, se) in refs.items():
            o = get(res, "compounds", comp)
            vals = [num(get(o, k)) for k in ("e0", "emax", "log10_ec50", "hill")]
            if any(v is None for v in vals):
                check(f"fit:{comp}:minimum", False, f"missing e0/emax/log10_ec50/hill for {comp}")
                continue
            s_rep = sse(data[comp], vals)
            check(f"fit:{comp}:minimum", s_rep <= s_min * (1 + 1e-5) + 1e-9,
                  f"SSE at reported parameters {s_rep:.4f}, least-squares minimum {s_min:.4f}")
            check_num(f"fit:{comp}:log10_ec50", vals[2], p[2], 0.0, 0.003)
            check_num(f"fit:{comp}:ec50_uM", get(o, "ec50_uM"), 10 ** p[2], 0.007, 0.0)
            check_num(f"fit:{comp}:hill", vals[3], p[3], 0.0, 0.005)
            check_num(f"fit:{comp}:emax", vals[1], p[1], 0.0, 0.05 + 0.003 * abs(p[1]))
            check_num(f"fit:{comp}:se.log10_ec50", get(o, "se", "log10_ec50"), se[2], 0.02, 0.0)
            check_num(f"fit:{comp}:se.emax", get(o, "se", "emax"), se[1], 0.02, 0.0)
        if "A" in refs and "B" in refs:
            check_num("results:potency_ratio_B_over_A", get(res, "potency_ratio_B_over_A"),
                      10 ** (refs["B"][0][2] - refs["A"][0][2]), 0.01, 0.0)
    check_report(read_text("report.md"), 400, [
        ("EC50 of A (uM)", 10 ** refs["A"][0][2], 0.01, 0.0),
        ("EC50 of B (uM)", 10 ** refs["B"][0][2], 0.01, 0.0),
    ])
    check_logs(3)


if __name__ == "__main__":
    run(main)
