#!/usr/bin/env python3
"""Validator for rob-arm-ik.

Run from the workspace root:  python3 checks/validate.py
For every target in data/targets.csv it recomputes reachability (reach tolerance
1e-6 m, wrist limit |q3| <= 1.9 rad, preferred branch q2 >= 0), then checks the
reported joint angles with an independent forward-kinematics implementation
(same link lengths as sim/arm.py, which must be unmodified).
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
    "data/targets.csv": "eb2ec1ada224d73e399f6f493098618252b589d30b9eda8113ce6e63193f544d",
    "sim/arm.py": "013f1c282cae761e42524ddd89789b4d600ce5e582abb3d2a469a60d11052363",
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
import csv

LINKS = (1.0, 0.8, 0.3)
Q3_LIMIT = 1.9


def wrap(a):
    return math.atan2(math.sin(a), math.cos(a))


def fk(q):
    x = y = th = 0.0
    for length, qi in zip(LINKS, q):
        th += qi
        x += length * math.cos(th)
        y += length * math.sin(th)
    return x, y, th


def reference_ik(x, y, phi):
    L1, L2, L3 = LINKS
    wx, wy = x - L3 * math.cos(phi), y - L3 * math.sin(phi)
    r = math.hypot(wx, wy)
    if not (abs(L1 - L2) - 1e-6 <= r <= L1 + L2 + 1e-6):
        return None
    c2 = max(-1.0, min(1.0, (r * r - L1 * L1 - L2 * L2) / (2 * L1 * L2)))
    for q2 in (math.acos(c2), -math.acos(c2)):
        q1 = wrap(math.atan2(wy, wx) - math.atan2(L2 * math.sin(q2), L1 + L2 * math.cos(q2)))
        q3 = wrap(phi - q1 - q2)
        if abs(q3) <= Q3_LIMIT + 1e-9:
            return (q1, q2, q3)
    return None


def main():
    check_deliverables()
    check_protected()
    with open("data/targets.csv", newline="") as f:
        targets = [(r["target_id"], float(r["x"]), float(r["y"]), math.radians(float(r["phi_deg"])))
                   for r in csv.DictReader(f)]
    res, err = load_json("results.json")
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        sols = get(res, "solutions")
        by_id = {}
        if isinstance(sols, list):
            for s in sols:
                if isinstance(s, dict) and isinstance(s.get("id"), str):
                    by_id[s["id"]] = s
        check("results:solutions", len(by_id) == len(targets),
              f"{len(by_id)} solutions for {len(targets)} targets")
        n_reach = 0
        for tid, x, y, phi in targets:
            ref = reference_ik(x, y, phi)
            n_reach += ref is not None
            s = by_id.get(tid)
            if s is None:
                check(f"target:{tid}", False, "no solution entry")
                continue
            reach = s.get("reachable")
            if ref is None:
                check(f"target:{tid}", reach is False, "correctly unreachable" if reach is False
                      else f"target is unreachable (workspace or wrist limit) but reported reachable={short(reach)}")
                continue
            q = s.get("q")
            if reach is not True or not isinstance(q, list) or len(q) != 3 or any(num(a) is None for a in q):
                check(f"target:{tid}", False, f"reachable target: expected reachable=true and q=[q1,q2,q3], got reachable={short(reach)} q={short(q)}")
                continue
            q = [float(a) for a in q]
            px, py, pphi = fk(q)
            pos_err = math.hypot(px - x, py - y)
            ang_err = abs(wrap(pphi - phi))
            problems = []
            if pos_err > 1e-5 or ang_err > 1e-5:
                problems.append(f"forward kinematics misses the target (pos err {pos_err:.2e} m, angle err {ang_err:.2e} rad)")
            if any(abs(a) > math.pi + 1e-9 for a in q):
                problems.append("angles not wrapped to (-pi, pi] (degrees?)")
            if abs(q[2]) > Q3_LIMIT + 1e-6:
                problems.append(f"wrist limit violated (q3 = {q[2]:.4f})")
            if max(abs(wrap(a - b)) for a, b in zip(q, ref)) > 1e-4:
                problems.append(f"not the specified branch (expected q = [{', '.join(f'{a:.4f}' for a in ref)}])")
            fe = num(s.get("fk_error"))
            if fe is None or fe < 0 or fe > 1e-5:
                problems.append(f"fk_error must be a number in [0, 1e-5], got {short(s.get('fk_error'))}")
            m = num(s.get("manipulability"))
            want_m = LINKS[0] * LINKS[1] * abs(math.sin(ref[1]))
            if m is None or abs(m - want_m) > 1e-4:
                problems.append(f"manipulability {short(s.get('manipulability'))} != {want_m:.5f}")
            check(f"target:{tid}", not problems, "pose reached on the specified branch" if not problems else "; ".join(problems))
        check_int("results:n_reachable", get(res, "n_reachable"), n_reach)
        best = min((t for t in targets if reference_ik(*t[1:]) is not None),
                   key=lambda t: abs(math.sin(reference_ik(*t[1:])[1])))[0]
        check("results:closest_to_singularity", get(res, "closest_to_singularity") == best,
              f"reported {short(get(res, 'closest_to_singularity'))}, expected {best}")
    check_report(read_text("report.md"), 400, [])
    report = read_text("report.md") or ""
    unreach = [t[0] for t in targets if reference_ik(*t[1:]) is None]
    missing = [u for u in unreach if u not in report]
    check("report:unreachable_named", not missing, "unreachable targets discussed" if not missing
          else f"report does not name unreachable targets {missing}")
    check_logs(3)


if __name__ == "__main__":
    run(main)
