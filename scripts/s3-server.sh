#!/usr/bin/env bash
# A real S3-compatible server for the tests: moto's server (moto[server]
# 5.2.5 from the venv scripts/s3-env.sh installs once in $MASS_CACHE,
# default ~/.cache/mass) on 127.0.0.1 at a free port, in memory (its objects
# are gone when it stops). One server is shared by every test process: a
# second `start` finds it answering and reuses it; tests create buckets of
# their own.
#
#   eval "$(scripts/s3-server.sh start | sed 's/^/export /')"   # installs if needed, starts or reuses, waits
#   scripts/s3-server.sh url     # the running server's endpoint (fails if none)
#   scripts/s3-server.sh stop    # idempotent
#
# `start` prints the lines to export (object_store's AmazonS3Builder::from_env
# reads the AWS_ ones), everything else goes to stderr:
#   MASS_S3_ENDPOINT=http://127.0.0.1:PORT
#   AWS_ENDPOINT=http://127.0.0.1:PORT
#   AWS_ALLOW_HTTP=true
#   AWS_ACCESS_KEY_ID=testing
#   AWS_SECRET_ACCESS_KEY=testing
#   AWS_REGION=us-east-1
#   MASS_S3_PYTHON=<cache>/s3-venv/bin/python   (boto3; scripts/s3-check.py)
#
# The server's pid and port are in $MASS_CACHE/moto.pid and moto.port, its
# log (werkzeug's access log: one line per request) in moto-PORT.log.
# Concurrent starts and stops wait for each other (flock on
# $MASS_CACHE/moto.lock). Cost: the venv once (~38 s, see s3-env.sh), then
# ~1-2 s to start the server, ~0.7 s to find a running one, ~2 s to stop it.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${MASS_CACHE:-$HOME/.cache/mass}"

say() { echo "s3-server: $*" >&2; }

mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
PIDFILE="$CACHE/moto.pid"
PORTFILE="$CACHE/moto.port"

# The pid in the pid file, if it is a live moto server (not a recycled pid).
server_pid() {
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null)" || return 1
    [ -n "$pid" ] || return 1
    grep -qa 'moto\.server' "/proc/$pid/cmdline" 2>/dev/null || return 1
    echo "$pid"
}
# Whether moto answers on the port (a HEAD of its dashboard: no body, no S3 state).
answers() {
    curl -sf -I -o /dev/null --max-time 2 "http://127.0.0.1:$1/moto-api/"
}
# The running server's port, if its pid is alive and it answers.
running_port() {
    local port
    server_pid >/dev/null || return 1
    port="$(cat "$PORTFILE" 2>/dev/null)" || return 1
    [ -n "$port" ] && answers "$port" || return 1
    echo "$port"
}
lock() {
    exec 9>"$CACHE/moto.lock"
    flock 9
}
# With the lock held: kills the server in the pid file, if any, and waits
# for it to exit.
stop_locked() {
    local pid
    if pid="$(server_pid)"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
        say "stopped moto (pid $pid)"
    fi
    rm -f "$PIDFILE" "$PORTFILE"
}
# With the lock held: starts a server at a free port and waits until it
# answers; prints its port.
launch() {
    local py="$1" port log pid
    rm -f "$CACHE"/moto-*.log
    # The port is free when asked; if another process takes it before moto
    # binds it, moto exits at once and another port is tried.
    for _ in 1 2 3; do
        port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
        log="$CACHE/moto-$port.log"
        # Its own session, so the caller's process group ending does not end
        # it; `stop` does. Not holding the lock (fd 9), nor the caller's stdout.
        setsid "$py" -m moto.server -H 127.0.0.1 -p "$port" </dev/null >"$log" 2>&1 9>&- &
        pid=$!
        echo "$pid" >"$PIDFILE"
        local deadline=$((SECONDS + 60))
        while [ "$SECONDS" -lt "$deadline" ]; do
            if answers "$port"; then
                echo "$port" >"$PORTFILE"
                echo "$port"
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "moto (pid $pid) did not answer on port $port within 60 s; its log is $log:"
            tail -20 "$log" >&2 || true
            stop_locked
            return 1
        fi
        grep -q 'Address already in use' "$log" || break
        say "port $port was taken before moto bound it; trying another"
    done
    say "moto did not start; its log is $log:"
    tail -20 "$log" >&2 || true
    rm -f "$PIDFILE"
    return 1
}

case "${1:-start}" in
stop)
    lock
    stop_locked
    exit 0
    ;;
url)
    if port="$(running_port)"; then
        echo "http://127.0.0.1:$port"
        exit 0
    fi
    say "no moto server is running (scripts/s3-server.sh start)"
    exit 1
    ;;
start) ;;
*)
    echo "usage: $0 start|stop|url" >&2
    exit 2
    ;;
esac

PY="$("$HERE/s3-env.sh" | sed -n 's/^MASS_S3_PYTHON=//p')"
[ -n "$PY" ] || { say "scripts/s3-env.sh printed no MASS_S3_PYTHON"; exit 1; }
lock
if port="$(running_port)"; then
    say "moto is running (pid $(server_pid)) at http://127.0.0.1:$port"
else
    stop_locked
    start=$SECONDS
    port="$(launch "$PY")"
    say "moto started (pid $(server_pid)) at http://127.0.0.1:$port in $((SECONDS - start)) s; log $CACHE/moto-$port.log"
fi
URL="http://127.0.0.1:$port"
echo "MASS_S3_ENDPOINT=$URL"
echo "AWS_ENDPOINT=$URL"
echo "AWS_ALLOW_HTTP=true"
echo "AWS_ACCESS_KEY_ID=testing"
echo "AWS_SECRET_ACCESS_KEY=testing"
echo "AWS_REGION=us-east-1"
echo "MASS_S3_PYTHON=$PY"
