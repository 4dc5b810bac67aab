#!/usr/bin/env bash
# llama.cpp's own server (`llama-server`), built once from the llama.cpp
# sources vendored in the llama-cpp-python 0.3.36 sdist (the release whose
# converter makes the trainer's adapter GGUFs) and cached in $MASS_CACHE
# (default ~/.cache/mass):
#
#   $MASS_CACHE/llama-server-0.3.36/bin/llama-server
#   $MASS_CACHE/cmake-venv/          cmake and ninja from PyPI, for the build
#
#   scripts/llama-server-env.sh     # prints the binary's path on stdout
#
# Why this server for the real loop: with `--jinja --chat-template-file
# trainers/chatml_tools.serve.jinja` it renders prompts with the template
# the trainer trains with and parses the model's <tool_call> blocks into
# structured `tool_calls`; llama-cpp-python's chat endpoint renders with the
# GGUF's built-in template and returns tool calls as text
# (../shared/notes/real-training.md). It also takes several `--lora`
# adapters and picks one per request (`lora` in the body, `/lora-adapters`).
#
# Idempotent; concurrent runs wait for each other (flock). First build
# (ggml, llama, common and the server, Release, no web UI, no TLS): 10.5 to
# 14 minutes of CPU measured here, so about 6 to 7 minutes on 2 idle cores.
set -euo pipefail
CACHE="${MASS_CACHE:-$HOME/.cache/mass}"
VERSION=0.3.36
OUT="$CACHE/llama-server-$VERSION"
BIN="$OUT/bin/llama-server"
TOOLS="$CACHE/cmake-venv"
say() { echo "llama-server-env: $*" >&2; }
mkdir -p "$CACHE"
exec 9>"$CACHE/llama-server.lock"
flock 9
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi
if ! "$TOOLS/bin/cmake" --version >/dev/null 2>&1 || ! "$TOOLS/bin/ninja" --version >/dev/null 2>&1; then
    say "installing cmake and ninja into $TOOLS"
    rm -rf "$TOOLS"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q --no-cache-dir 'cmake==4.*' 'ninja==1.*' >&2
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
say "fetching the llama-cpp-python==$VERSION sdist for its vendored llama.cpp"
# --no-binary for this package only: ':all:' would try to build CMake from source.
"$TOOLS/bin/pip" download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$tmp" >&2
tar -xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp"
src="$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp"
start=$SECONDS
say "building llama-server (once; minutes on 2 cores)"
# Not -march=native: built natively here, ggml uses the CPU's AMX tiles,
# which this VM's kernel does not enable (scripts/llamacpp-server.sh).
PATH="$TOOLS/bin:$PATH" cmake -S "$src" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_HTML=OFF -DBUILD_SHARED_LIBS=OFF >"$tmp/cmake.log" 2>&1 \
    || { tail -30 "$tmp/cmake.log" >&2; exit 1; }
PATH="$TOOLS/bin:$PATH" cmake --build "$tmp/build" --target llama-server -j "$(nproc)" >"$tmp/build.log" 2>&1 \
    || { tail -30 "$tmp/build.log" >&2; exit 1; }
rm -rf "$OUT.part"
mkdir -p "$OUT.part/bin"
cp "$tmp/build/bin/llama-server" "$OUT.part/bin/"
cp "$src/LICENSE" "$OUT.part/"
rm -rf "$OUT"
mv "$OUT.part" "$OUT"
say "built in $((SECONDS - start)) s"
echo "$BIN"
