#!/usr/bin/env bash
# The official OpenAI Python client, for the tests that drive `mass proxy`
# with a real client (tests/proxy_llamacpp.rs runs
# tests/fixtures/openai_session.py with it). Installed once from PyPI into a
# venv in $MASS_CACHE/openai-venv (default ~/.cache/mass), at pinned versions:
# openai and every package it pulls in, so the client's wire behaviour
# (headers, retries, SSE parsing) does not change under the tests. Prints one
# line for the caller to export, everything else goes to stderr:
#   MASS_OPENAI_PYTHON=<cache>/openai-venv/bin/python
#
#   eval "$(scripts/openai-env.sh | sed 's/^/export /')"
#
# Idempotent: a later run checks the installed versions and exits at once
# (~0.5 s). Concurrent runs wait for each other (flock on
# $MASS_CACHE/openai-env.lock). First run: ~11 s, 71 MB.
set -euo pipefail
CACHE="${MASS_CACHE:-$HOME/.cache/mass}"

say() { echo "openai-env: $*" >&2; }

mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
VENV="$CACHE/openai-venv"
PY="$VENV/bin/python"
# openai 3.57.0 (the current release when this was written) and its
# dependency closure as pip resolved it on Python 3.11.
PINS=(
    openai==3.57.0
    annotated-types==0.8.0
    anyio==4.16.0
    h11==0.16.0
    httpcore2==2.16.2
    httpx2==2.16.2
    idna==3.20
    jiter==0.19.0
    pydantic==2.14.4
    pydantic_core==2.50.5
    sniffio==1.3.1
    truststore==0.10.5
    typing-inspection==0.4.5
    typing_extensions==4.16.0
)
exec 9>"$CACHE/openai-env.lock"
flock 9

installed() {
    [ -x "$PY" ] && "$PY" - "${PINS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if md.version(name) != want:
        sys.exit(1)
import openai  # noqa: F401
PY
}
if installed; then
    say "$VENV is current"
else
    say "installing openai into $VENV (once; ~11 s, 71 MB)"
    start=$SECONDS
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --no-cache-dir --disable-pip-version-check "${PINS[@]}" >&2
    installed || { say "the venv in $VENV does not hold the pinned versions"; exit 1; }
    say "installed in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1)"
fi
echo "MASS_OPENAI_PYTHON=$PY"
