#!/usr/bin/env python3
"""Check the `signs` of every flaw of the example tasks (called by selftest.sh).

A flaw's `signs` (task.toml, `[[flaws]]`) are literal substrings of the flawed
run's deliverables: what an expert reader of the workspace would notice. They
feed the simulated judge's perception; the hidden checks never reach the judge.

For every task this runs the reference solver (solution/solve.py) over every
subset of the task's flaws (the empty subset is the clean run), each time in a
fresh copy of files/, and reads the deliverables (report.md, results.json,
logs.txt). It then requires:

  1. every sign of a flaw appears in the deliverables of every run where that
     flaw is active, whatever other flaws are active with it;
  2. no sign of a flaw appears in the deliverables of any run where that flaw
     is not active (the clean run included);
  3. every flaw has at least one sign.

The `evidence` phrase of a blind-spot flaw (report.md) is held to rule 2; it
need not survive every combination (another flaw can change the verdict it
sits in), which is what the signs are for.

Usage: check_signs.py [--keep DIR] [task-id ...]
Prints one "  ok    ..." or "  FAIL  ..." line per task and rule (the format of
selftest.sh); exits 1 on any failure. PYTHON picks the solver's interpreter.
"""
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.environ.get("PYTHON", sys.executable or "python3")
TEXT_DELIVERABLES = ("report.md", "results.json", "logs.txt")


def run_subset(tdir, deliverables, subset, tmp, keep):
    """Runs the solver with the flaws in `subset`; returns {file: text} or an error string."""
    ws = tempfile.mkdtemp(dir=tmp)
    shutil.copytree(os.path.join(tdir, "files"), ws, dirs_exist_ok=True)
    cmd = [PY, os.path.join(tdir, "solution", "solve.py")]
    for name in subset:
        cmd += ["--flaw", name]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        proc = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "solver timed out"
    if proc.returncode != 0:
        return f"solver exit {proc.returncode}: " + " ".join(proc.stderr.strip().splitlines()[-2:])
    out = {}
    for rel in deliverables:
        path = os.path.join(ws, rel)
        if rel in TEXT_DELIVERABLES and os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                out[rel] = f.read()
    if keep:
        dest = os.path.join(keep, os.path.basename(tdir), "+".join(subset) or "clean")
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        for rel, text in out.items():
            with open(os.path.join(dest, rel), "w", encoding="utf-8") as f:
                f.write(text)
    shutil.rmtree(ws, ignore_errors=True)
    return out


def check_task(tid, tmp, keep, jobs):
    """Returns a list of (ok: bool, message) lines for one task."""
    tdir = os.path.join(HERE, tid)
    with open(os.path.join(tdir, "task.toml"), "rb") as f:
        task = tomllib.load(f)
    flaws = task.get("flaws", [])
    names = [fl["name"] for fl in flaws]
    deliverables = task.get("deliverables", list(TEXT_DELIVERABLES))
    subsets = [c for r in range(len(names) + 1) for c in itertools.combinations(names, r)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(lambda s: run_subset(tdir, deliverables, s, tmp, keep), subsets))
    lines = []
    crashed = [(s, r) for s, r in zip(subsets, runs) if isinstance(r, str)]
    for s, err in crashed:
        lines.append((False, f"{tid}: solver with flaws {{{', '.join(s)}}} failed ({err})"))
    if crashed:
        return lines
    for fl in flaws:
        name = fl["name"]
        signs = fl.get("signs", [])
        if not isinstance(signs, list) or not all(isinstance(s, str) and s for s in signs):
            lines.append((False, f"{tid}: flaw {name}: signs must be a list of non-empty strings"))
            continue
        if not signs:
            lines.append((False, f"{tid}: flaw {name} has no signs"))
            continue
        errors = []
        for subset, out in zip(subsets, runs):
            label = "{" + ", ".join(subset) + "}" if subset else "{} (the clean run)"
            for sign in signs:
                seen = any(sign in text for text in out.values())
                if name in subset and not seen:
                    errors.append(f"sign {sign!r} missing from the run with flaws {label}")
                elif name not in subset and seen:
                    errors.append(f"sign {sign!r} present in the run with flaws {label}, where {name} is not active")
            # The evidence phrase (selftest.sh checks it against the single-flaw run)
            # may be absent when another flaw changes the verdict, but it must never
            # show up where its flaw is not active.
            ev = fl.get("evidence")
            if ev and name not in subset and ev in out.get("report.md", ""):
                errors.append(f"evidence {ev!r} present in the run with flaws {label}, where {name} is not active")
        if errors:
            more = f" (+{len(errors) - 2} more)" if len(errors) > 2 else ""
            lines.append((False, f"{tid}: flaw {name}: " + "; ".join(errors[:2]) + more))
        else:
            lines.append((True, f"{tid}: flaw {name}: {len(signs)} sign(s) hold over {len(subsets)} flaw combinations"))
    return lines


def main(argv):
    keep = None
    if argv[:1] == ["--keep"]:
        keep, argv = os.path.abspath(argv[1]), argv[2:]
    tasks = argv or sorted(
        d for d in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, d, "task.toml"))
    )
    jobs = int(os.environ.get("JOBS", os.cpu_count() or 2))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for tid in tasks:
            for ok, msg in check_task(tid, tmp, keep, jobs):
                failed += not ok
                print(("  ok    " if ok else "  FAIL  ") + msg, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
