#!/usr/bin/env bash
# The main job, offline: two MASS cycles on the twelve example tasks with the
# built-in simulated backend and trainer (examples/quickstart.toml). Writes the
# ledger to ./mass-ledger (override with MASS_LEDGER). Re-running it resumes the
# run if it was interrupted, or replays it from the ledger if it finished.
# Needs: cargo (rustup toolchain) and python3 (standard library only).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
mass=target/release/mass
export MASS_LEDGER="${MASS_LEDGER:-mass-ledger}"
"$mass" run examples/quickstart.toml
echo
"$mass" status quickstart
"$mass" verify
