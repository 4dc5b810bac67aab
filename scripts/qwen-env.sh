#!/usr/bin/env bash
# Qwen Code 0.24.4, the external harness the tests drive against a scripted
# OpenAI-compatible server (tests/fixtures/scripted_openai.py). Installed once
# with npm into $MASS_CACHE_DIR/qwen-code-0.24.4 (default ~/.cache/mass; falls
# back to $MASS_CACHE like the other scripts). Prints two lines for the caller
# to export, everything else goes to stderr:
#   QWEN_BIN=<cache>/qwen-code-0.24.4/node_modules/.bin/qwen
#   QWEN_DIR=<cache>/qwen-code-0.24.4      (what the sandbox must let it read;
#            a mirror under /tmp when the sandbox user cannot reach the cache)
#
#   eval "$(scripts/qwen-env.sh | sed 's/^/export /')"
#
# The package declares node >= 22 but runs on node 20 (npm warns). Its bundled
# ripgrep ships without the execute bit; it is chmod +x'ed here. The version is
# pinned: prompts, tools and request shapes change between releases.
# Idempotent: a later run checks the installed version and exits at once.
# Concurrent runs wait for each other (flock on <cache>/qwen-env.lock).
set -euo pipefail
VERSION=0.24.4
CACHE="${MASS_CACHE_DIR:-${MASS_CACHE:-$HOME/.cache/mass}}"

say() { echo "qwen-env: $*" >&2; }

mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
DIR="$CACHE/qwen-code-$VERSION"
PKG="$DIR/node_modules/@qwen-code/qwen-code"
BIN="$DIR/node_modules/.bin/qwen"
exec 9>"$CACHE/qwen-env.lock"
flock 9

installed() {
    [ -x "$BIN" ] && [ "$(node -p "require('$PKG/package.json').version" 2>/dev/null)" = "$VERSION" ]
}
if installed; then
    say "$DIR is current"
else
    say "installing @qwen-code/qwen-code@$VERSION into $DIR (once; ~10 s, ~145 MB)"
    start=$SECONDS
    rm -rf "$DIR"
    mkdir -p "$DIR"
    npm install --silent --no-audit --no-fund --prefix "$DIR" "@qwen-code/qwen-code@$VERSION" >&2
    installed || { say "the install in $DIR did not produce qwen $VERSION"; exit 1; }
    say "installed in $((SECONDS - start)) s, $(du -sh "$DIR" | cut -f1)"
fi

# The bundled ripgrep (grep_search, glob) ships without its execute bit.
found=0
while IFS= read -r -d '' rg; do
    chmod +x "$rg"
    found=1
done < <(find "$DIR/node_modules" -path '*/vendor/ripgrep/x64-linux/rg' -type f -print0)
if [ "$found" = 0 ]; then
    say "warning: no vendor/ripgrep/x64-linux/rg in $DIR"
fi

# The sandbox runs commands as an unprivileged user, who cannot traverse a
# 0700 home directory: when the cache is not reachable by others, the install
# is mirrored (~1 s) into a directory of our own under /tmp that is.
reachable() {
    local d="$1"
    while [ "$d" != / ]; do
        [ "$(( $(stat -c '%a' "$d") % 10 & 1 ))" = 1 ] || return 1
        d="$(dirname "$d")"
    done
}
RUN_DIR="$DIR"
if ! reachable "$DIR"; then
    RUN_DIR="${MASS_QWEN_RUN_DIR:-/tmp/mass-qwen-code-$VERSION-$(id -u)}"
    if [ -e "$RUN_DIR" ] && [ "$(stat -c '%u' "$RUN_DIR")" != "$(id -u)" ]; then
        say "$RUN_DIR exists and is not ours: refusing to run a program from it"
        exit 1
    fi
    if ! cmp -s "$PKG/package.json" "$RUN_DIR/node_modules/@qwen-code/qwen-code/package.json"; then
        say "mirroring $DIR to $RUN_DIR (the sandbox user cannot reach the cache)"
        rm -rf "$RUN_DIR"
        mkdir -m 0755 "$RUN_DIR"
        cp -a "$DIR/." "$RUN_DIR/"
    fi
    chmod 0755 "$RUN_DIR"
fi

echo "QWEN_BIN=$RUN_DIR/node_modules/.bin/qwen"
echo "QWEN_DIR=$RUN_DIR"
