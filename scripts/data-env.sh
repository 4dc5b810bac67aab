#!/usr/bin/env bash
# DuckDB and polars, for the test that loads `mass export tables` as a
# notebook would (tests/tables.rs runs tests/fixtures/tables_check.py with
# them). Installed once from PyPI into a venv in $MASS_CACHE/data-venv
# (default ~/.cache/mass), at pinned versions, so the readers' Parquet and
# CSV handling does not change under the test. Prints one line for the
# caller to export, everything else goes to stderr:
#   MASS_DATA_PYTHON=<cache>/data-venv/bin/python
#
#   eval "$(scripts/data-env.sh | sed 's/^/export /')"
#
# Idempotent: a later run checks the installed versions and exits at once.
# Concurrent runs wait for each other (flock on $MASS_CACHE/data-env.lock).
set -euo pipefail
CACHE="${MASS_CACHE:-$HOME/.cache/mass}"

say() { echo "data-env: $*" >&2; }

mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
VENV="$CACHE/data-venv"
PY="$VENV/bin/python"
# duckdb 2.0.0 and polars 2.1.0 (the current releases when this was
# written) and their dependency closure as pip resolved it on Python 3.11.
PINS=(
    duckdb==2.0.0
    polars==2.1.0
    polars-runtime-32==2.1.0
)
exec 9>"$CACHE/data-env.lock"
flock 9

installed() {
    [ -x "$PY" ] && "$PY" - "${PINS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if md.version(name) != want:
        sys.exit(1)
import duckdb, polars  # noqa: F401
PY
}
if installed; then
    say "$VENV is current"
else
    say "installing duckdb and polars into $VENV (once)"
    start=$SECONDS
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --no-cache-dir --disable-pip-version-check "${PINS[@]}" >&2
    installed || { say "the venv in $VENV does not hold the pinned versions"; exit 1; }
    say "installed in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1)"
fi
echo "MASS_DATA_PYTHON=$PY"
