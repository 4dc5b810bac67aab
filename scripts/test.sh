#!/usr/bin/env bash
# Runs every test of the project: the Rust workspace (unit, property, crash,
# golden and end-to-end CLI tests), the OpenAI-compatible backend against a
# real llama.cpp server, the recording proxy and Qwen Code as an external
# harness, and the example task suite's self-test.
# Needs: cargo (rustup toolchain), python3 with venv and pip, a C++ compiler,
# curl, node and npm (Qwen Code), and PyPI (the server is built from source once, ~4 minutes on 2
# cores, and cached in ~/.cache/mass).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
cargo test --workspace --doc
# The OpenAI-compatible backend against a real llama.cpp server (built once
# and cached in ~/.cache/mass; always stopped afterwards).
trap 'scripts/llamacpp-server.sh stop; scripts/s3-server.sh stop' EXIT
# Ledgers on a real S3-compatible server (moto, installed once in
# ~/.cache/mass/s3-venv by scripts/s3-env.sh, ~40 s the first time): push,
# clone, verify and replay away from the origin; pushes killed before every
# write and at random moments, pulls killed; a corrupted pack; a planted
# secret; two writers racing on one run (~2 minutes).
eval "$(scripts/s3-server.sh start | sed 's/^/export /')"
cargo test --test remote_cli -- --ignored
# Work items through the same server (`mass run --workers`, `mass worker`):
# three workers give the in-process head; workers SIGKILLed at random
# moments; the coordinator killed and resumed; the store down for 10 s and
# past the coordinator's patience (exit 7, then resume); a worker cut off
# from the store; a poison item (~6 minutes; one at a time: each test runs
# three or four worker processes on the 2 cores).
cargo test --test workers_cli -- --ignored --test-threads=1
scripts/s3-server.sh stop
MASS_LLAMACPP_URL="$(scripts/llamacpp-server.sh start)"
export MASS_LLAMACPP_URL
cargo test --workspace --test llamacpp -- --ignored
# Whole MASS cycles through the `mass` binary against the same server
# (examples/llamacpp.toml, offline replay, a live re-judge, the planted key),
# and against a second server of the test's own that it SIGKILLs mid-run and
# restarts (a few minutes on 2 cores; one test at a time: the server answers
# one request at a time).
cargo test --test llamacpp_cycle -- --ignored --test-threads=1 --nocapture
scripts/llamacpp-server.sh stop
# The recording proxy with the official OpenAI Python client (a venv built
# once in ~/.cache/mass/openai-venv) against a llama.cpp server of the
# test's own, then replayed with that server stopped.
eval "$(scripts/openai-env.sh | sed 's/^/export /')"
cargo test --test proxy_llamacpp -- --ignored --nocapture
# Qwen Code (npm, installed once in ~/.cache/mass) as the team harness
# against a scripted server: recorded, replayed, re-judged, forked, exported
# and re-executed against its recording with the server stopped.
eval "$(scripts/qwen-env.sh | sed 's/^/export /')"
cargo test --test qwen_code -- --ignored --nocapture
# `mass export tables` loaded by DuckDB and polars (a venv built once in
# ~/.cache/mass/data-venv, ~10 s), the README's notebook example checked
# against `mass report --json`.
eval "$(scripts/data-env.sh | sed 's/^/export /')"
cargo test --test tables -- --ignored --nocapture
# llama.cpp's own server (built once from the vendored llama.cpp, ~7
# minutes of 2 cores, cached), for the trainer's self-test and the real loop.
scripts/llama-server-env.sh >/dev/null
# The real LoRA trainer (trainers/lora_sft.py): its environment built once
# (scripts/train-env.sh: ~2 minutes and 6.5 GB in ~/.cache/mass the first
# time), then a few training steps on CPU checked end to end (continued
# from an adapter too), the adapter changing the model's greedy output, and
# one llama-server choosing the adapter per request as one started with it.
bash trainers/selftest.sh
# The real loop (examples/real-cpu.toml): two cycles of SmolLM2-135M with
# real LoRA training between them, the adapters served to cycle 2 by the
# one llama-server mass starts itself (restarted with each new adapter),
# template parity on every call, each chosen checkpoint's validation loss
# below the base model's, then replayed offline (about 8 minutes on 2 cores).
cargo test --test real_cpu -- --ignored --nocapture
# The HTML report in a real headless browser (Debian's chromium, installed
# once; playwright-core cached in ~/.cache/mass/browser); screenshots are
# kept in target/report-html/.
eval "$(scripts/browser-env.sh | sed 's/^/export /')"
cargo test --test audit -- --ignored --nocapture
if [ -x examples/tasks/selftest.sh ] || [ -f examples/tasks/selftest.sh ]; then
  bash examples/tasks/selftest.sh
fi
