#!/usr/bin/env bash
# End-to-end self-test of the LoRA trainer (trainers/test_lora_sft.py) in the
# train venv. Prepares the environment first (scripts/train-env.sh: cached, a
# few seconds once built; ~2 min and ~6.5 GB the first time). The serving and
# tokenizer checks need the llama-cpp-python venv of scripts/llamacpp-server.sh
# ($MASS_CACHE/llamacpp-venv) and llama.cpp's llama-server
# (scripts/llama-server-env.sh). A few minutes on 2 cores; ends with
# "selftest: N passed, M failed" and exits non-zero on any failure.
# KEEP_LORA_SFT_TEST=1 keeps the trainer outputs (their directory is printed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$("$ROOT/scripts/train-env.sh")"
exec "$PY" "$ROOT/trainers/test_lora_sft.py" "$@"
