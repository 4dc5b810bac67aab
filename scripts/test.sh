#!/usr/bin/env bash
# Runs every test of the project: the Rust workspace (unit, property, crash,
# golden and end-to-end CLI tests) and the example task suite's self-test.
# Needs: cargo (rustup toolchain), python3 (standard library only).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
cargo test --workspace --doc
if [ -x examples/tasks/selftest.sh ] || [ -f examples/tasks/selftest.sh ]; then
  bash examples/tasks/selftest.sh
fi
