#!/usr/bin/env bash
# A headless browser for the HTML report's test: Debian's chromium (apt,
# once) and playwright-core from npm (cached in $MASS_CACHE/browser,
# default ~/.cache/mass). Prints two lines for the caller to export:
#   MASS_CHROMIUM=/usr/bin/chromium
#   MASS_PLAYWRIGHT=<path of the playwright-core package>
set -euo pipefail
CACHE="${MASS_CACHE:-$HOME/.cache/mass}"
DIR="$CACHE/browser"
VERSION=1.64.1
if ! command -v chromium >/dev/null 2>&1; then
    echo "installing Debian's chromium (once)" >&2
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get install -y -q --no-install-recommends chromium >&2 ||
        { $SUDO apt-get update -q >&2 && $SUDO apt-get install -y -q --no-install-recommends chromium >&2; }
fi
PKG="$DIR/node_modules/playwright-core"
if [ "$(node -p "require('$PKG/package.json').version" 2>/dev/null)" != "$VERSION" ]; then
    echo "installing playwright-core $VERSION into $DIR (once)" >&2
    mkdir -p "$DIR"
    npm install --silent --no-audit --no-fund --prefix "$DIR" "playwright-core@$VERSION" >&2
fi
echo "MASS_CHROMIUM=$(command -v chromium)"
echo "MASS_PLAYWRIGHT=$PKG"
