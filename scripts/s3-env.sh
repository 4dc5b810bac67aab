#!/usr/bin/env bash
# A real S3-compatible server for the object-store tests: moto's server
# (moto[server] 5.2.5, an in-memory S3 that honours If-None-Match: * and
# If-Match on PutObject, which our client's conditional writes need) and
# boto3 (scripts/s3-check.py). Installed once from PyPI into a venv in
# $MASS_CACHE/s3-venv (default ~/.cache/mass), at pinned versions: moto with
# its server extra, boto3 and every package they pull in, so the server's
# S3 behaviour does not change under the tests. scripts/s3-server.sh starts
# the server from it. Prints one line for the caller to export, everything
# else goes to stderr:
#   MASS_S3_PYTHON=<cache>/s3-venv/bin/python
#
#   eval "$(scripts/s3-env.sh | sed 's/^/export /')"
#
# Idempotent: a later run checks the installed versions and exits at once
# (~0.6 s). Concurrent runs wait for each other (flock on
# $MASS_CACHE/s3-env.lock). First run: ~38 s, 317 MB (moto[server] pulls in
# cfn-lint, sympy, networkx, cryptography, docker, flask...).
set -euo pipefail
CACHE="${MASS_CACHE:-$HOME/.cache/mass}"

say() { echo "s3-env: $*" >&2; }

mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
VENV="$CACHE/s3-venv"
PY="$VENV/bin/python"
# moto[server] 5.2.5 and boto3 1.44.8 (the current release when this was
# written) and their dependency closure as pip resolved it on Python 3.11.
PINS=(
    'moto[server]==5.2.5'
    boto3==1.44.8
    annotated-types==0.8.0
    antlr4-python3-runtime==4.13.2
    attrs==26.1.0
    aws-xray-sdk==2.15.0
    blinker==1.9.0
    botocore==1.44.8
    certifi==2026.10.19.post1
    cffi==2.1.1
    cfn-lint==1.58.0
    charset-normalizer==3.5.3
    click==8.5.1
    cryptography==50.0.2
    docker==7.2.0
    Flask==3.1.3
    flask-cors==6.0.5
    graphql-core==3.3.2
    idna==3.20
    itsdangerous==2.2.0
    Jinja2==3.1.6
    jmespath==1.1.0
    joserfc==1.8.0
    jsonpatch==1.48
    jsonpath-ng==1.16.0
    jsonpointer==3.12
    jsonschema==4.26.0
    jsonschema-path==0.5.0
    jsonschema-specifications==2025.9.1
    lazy-object-proxy==1.13.0
    MarkupSafe==3.0.4
    mpmath==1.3.0
    networkx==3.6.1
    openapi-schema-validator==0.9.0
    openapi-spec-validator==0.9.0
    pathable==0.6.0
    py-partiql-parser==0.6.3
    pycparser==3.12
    pydantic==2.14.4
    pydantic-settings==2.16.3
    pydantic_core==2.50.5
    pyparsing==3.3.3
    python-dateutil==2.9.0.post0
    python-dotenv==1.2.4
    PyYAML==6.0.4
    referencing==0.37.0
    regex==2026.11.19
    requests==2.34.2
    responses==0.26.3
    rfc3339-validator==0.1.4
    rpds-py==2026.9.1
    s3transfer==0.19.3
    six==1.17.0
    sympy==1.14.0
    typing-inspection==0.4.5
    typing_extensions==4.16.0
    urllib3==2.8.0
    Werkzeug==3.1.9
    wrapt==2.5.2
    xmltodict==1.0.4
)
exec 9>"$CACHE/s3-env.lock"
flock 9

installed() {
    [ -x "$PY" ] && "$PY" - "${PINS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as md, re, sys
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if md.version(re.sub(r"\[.*\]", "", name)) != want:
        sys.exit(1)
import boto3, moto.server  # noqa: F401,E401
PY
}
if installed; then
    say "$VENV is current"
else
    say "installing moto[server] and boto3 into $VENV (once; ~38 s, 317 MB)"
    start=$SECONDS
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --no-cache-dir --disable-pip-version-check "${PINS[@]}" >&2
    installed || { say "the venv in $VENV does not hold the pinned versions"; exit 1; }
    say "installed in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1)"
fi
echo "MASS_S3_PYTHON=$PY"
