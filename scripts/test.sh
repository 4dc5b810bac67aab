#!/usr/bin/env bash
# Runs every test of the project: the Rust workspace (unit, property, crash,
# golden and end-to-end CLI tests), the OpenAI-compatible backend against a
# real llama.cpp server, and the example task suite's self-test.
# Needs: cargo (rustup toolchain), python3 with venv and pip, a C++ compiler,
# curl, and PyPI (the server is built from source once, ~4 minutes on 2
# cores, and cached in ~/.cache/mass).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
cargo test --workspace --doc
# The OpenAI-compatible backend against a real llama.cpp server (built once
# and cached in ~/.cache/mass; always stopped afterwards).
trap 'scripts/llamacpp-server.sh stop' EXIT
MASS_LLAMACPP_URL="$(scripts/llamacpp-server.sh start)"
export MASS_LLAMACPP_URL
cargo test -p engine --test llamacpp -- --ignored
if [ -x examples/tasks/selftest.sh ] || [ -f examples/tasks/selftest.sh ]; then
  bash examples/tasks/selftest.sh
fi
