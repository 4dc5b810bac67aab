#!/usr/bin/env python3
"""Re-embed the sha256 manifest of protected files into each task's validator.

For every task folder (or the ids given on the command line) this reads
`task.toml`, hashes each `protected` path under `files/`, rewrites the block
between `# BEGIN PROTECTED MANIFEST` and `# END PROTECTED MANIFEST` in
`checks/validate.py`. (The harness copies `checks/` into every workspace, so
the team self-checks with exactly the validator the harness runs.)

Run it after regenerating data (gen_data.py) or editing a simulator:
    python3 examples/tasks/refresh_manifests.py [task-id ...]
"""
import hashlib
import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.abspath(__file__))
BLOCK = re.compile(r"# BEGIN PROTECTED MANIFEST[^\n]*\n.*?# END PROTECTED MANIFEST", re.S)


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def refresh(tid):
    tdir = os.path.join(ROOT, tid)
    with open(os.path.join(tdir, "task.toml"), "rb") as f:
        task = tomllib.load(f)
    lines = ["# BEGIN PROTECTED MANIFEST (regenerate with examples/tasks/refresh_manifests.py)",
             "PROTECTED = {"]
    for rel in task.get("protected", []):
        lines.append(f'    "{rel}": "{sha256_of(os.path.join(tdir, "files", rel))}",')
    lines += ["}", "# END PROTECTED MANIFEST"]
    vpath = os.path.join(tdir, "checks", "validate.py")
    with open(vpath, encoding="utf-8") as f:
        src = f.read()
    if not BLOCK.search(src):
        raise SystemExit(f"{tid}: no PROTECTED MANIFEST block in checks/validate.py")
    src = BLOCK.sub(lambda _m: "\n".join(lines), src, count=1)
    with open(vpath, "w", encoding="utf-8") as f:
        f.write(src)
    print(f"{tid}: {len(task.get('protected', []))} protected files embedded")


def main():
    ids = sys.argv[1:] or sorted(
        d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "task.toml")))
    for tid in ids:
        refresh(tid)


if __name__ == "__main__":
    main()
