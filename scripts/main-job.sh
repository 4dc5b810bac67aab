#!/usr/bin/env bash
# The main job on the built-in offline path. Until the MASS engine lands
# (`mass run examples/quickstart.toml`), this is the scripted ledger demo: it
# fills a ledger with a workspace snapshot and an orchestrator/subagent
# conversation, then shows log, show, diff, verify and stats.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
mass=target/release/mass
export MASS_LEDGER="${MASS_LEDGER:-mass-ledger}"
[ -d "$MASS_LEDGER" ] || "$mass" init
"$mass" demo
echo; echo "== mass log"; "$mass" log
head=$("$mass" log --kind model.call --limit 1 | cut -c1-12)
echo; echo "== mass show $head"; "$mass" show "$head"
echo; echo "== mass verify"; "$mass" verify
echo; echo "== mass stats"; "$mass" stats
