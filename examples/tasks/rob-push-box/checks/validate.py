#!/usr/bin/env python3
"""Validator for rob-push-box.

Run from the workspace root:  python3 checks/validate.py
Replays every reported plan on an embedded copy of the pushing rules (so a
modified sim/push.py cannot change the verdict; its checksum is also verified),
recomputes the minimum number of moves by breadth-first search and checks
solvability, optimality, move and push counts.
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
    "sim/push.py": "ee7e9490429046b1e88bc26f152ec876deece2de1f14ac7212f1700c80efbb01",
    "sim/__init__.py": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "data/maps/m1.txt": "5b9502e58f01554853c63d2b41196fff4b1ff8ed13fff97ca75f9ab0194aa7bd",
    "data/maps/m2.txt": "975f71d02d377d1a8ead7219b42925298be908e94de57906abfc0a88b5e76e51",
    "data/maps/m3.txt": "7256b2453111a6c0fd7cd52924bb9d80b5d8100e6e70e59121e0ef509ab7bb56",
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
from collections import deque

MAPS = ["m1", "m2", "m3"]
DIRS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def load_map(path):
    walls, robot, box, goal = set(), None, None, None
    with open(path) as f:
        lines = [ln.rstrip("\n") for ln in f if ln.strip()]
    for r, line in enumerate(lines):
        for c, ch in enumerate(line):
            if ch == "#":
                walls.add((r, c))
            if ch in "R+":
                robot = (r, c)
            if ch in "B*":
                box = (r, c)
            if ch in "G*+":
                goal = (r, c)
    return walls, robot, box, goal


def move(walls, robot, box, a):
    dr, dc = DIRS[a]
    nr = (robot[0] + dr, robot[1] + dc)
    if nr in walls:
        return robot, box
    if nr == box:
        nb = (nr[0] + dr, nr[1] + dc)
        if nb in walls:
            return robot, box
        return nr, nb
    return nr, box


def shortest(walls, robot, box, goal):
    dist = {(robot, box): 0}
    q = deque([(robot, box)])
    while q:
        r, b = q.popleft()
        if b == goal:
            return dist[(r, b)]
        for a in "UDLR":
            n = move(walls, r, b, a)
            if n not in dist:
                dist[n] = dist[(r, b)] + 1
                q.append(n)
    return None


def main():
    check_deliverables()
    check_protected()
    res, err = load_json("results.json")
    if not isinstance(res, dict):
        check("results:json", False, f"results.json {err or 'top level is not an object'}")
    else:
        check("results:json", True, "results.json parsed")
        for m in MAPS:
            walls, robot, box, goal = load_map(f"data/maps/{m}.txt")
            best = shortest(walls, robot, box, goal)
            e = get(res, "maps", m)
            if not isinstance(e, dict):
                check(f"map:{m}", False, "no entry under maps")
                continue
            if best is None:
                ok = e.get("solvable") is False and e.get("plan") is None
                check(f"map:{m}", ok, "correctly reported unsolvable" if ok else
                      f"map is unsolvable but reported solvable={short(e.get('solvable'))} plan={short(e.get('plan'))}")
                continue
            plan = e.get("plan")
            if e.get("solvable") is not True or not isinstance(plan, str) or any(ch not in DIRS for ch in plan):
                check(f"map:{m}", False, f"map is solvable in {best} moves; expected solvable=true and a plan over UDLR, "
                      f"got solvable={short(e.get('solvable'))} plan={short(plan)}")
                continue
            r, b, pushes = robot, box, 0
            for a in plan:
                r2, b2 = move(walls, r, b, a)
                pushes += b2 != b
                r, b = r2, b2
            problems = []
            if b != goal:
                problems.append(f"replay leaves the box at {b}, goal is {goal}")
            if len(plan) != best:
                problems.append(f"plan has {len(plan)} moves, the minimum is {best}")
            if e.get("moves") != len(plan) or isinstance(e.get("moves"), bool):
                problems.append(f"moves={short(e.get('moves'))} but the plan has {len(plan)} actions")
            if e.get("pushes") != pushes or isinstance(e.get("pushes"), bool):
                problems.append(f"pushes={short(e.get('pushes'))} but the replay makes {pushes}")
            check(f"map:{m}", not problems, f"optimal {best}-move plan verified by replay" if not problems else "; ".join(problems))
    report = read_text("report.md")
    check_report(report, 300, [])
    if report is not None:
        missing = [m for m in MAPS if m not in report]
        check("report:maps", not missing, "all maps discussed" if not missing else f"maps not discussed: {missing}")
    check_logs(3)


if __name__ == "__main__":
    run(main)
