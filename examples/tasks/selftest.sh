#!/usr/bin/env bash
# Self-test of the example task suite (examples/tasks/).
#
# For every task folder it checks the folder contract (task.toml fields, flaw
# list, protected files present, size < 150 KB), then, each time in a fresh temporary
# workspace made from files/ (the checks stay in the task folder and run
# isolated, `python3 -I "$MASS_CHECKS/validate.py"`, as the harness runs them):
#   - reference solver without flaws        -> validate exits 0
#   - solver with each flaw                 -> exit 1 if caught_by_checks, else 0
#     (and then its evidence phrase is in report.md, absent from the reference's)
#   - no deliverables at all                -> exit 2
#   - malformed / type-confused deliverables -> exit 1, never a traceback
#   - one protected file modified           -> exit 1 with a FAIL protected: line
#   - validator run twice                   -> identical output (deterministic)
#   - solver over every subset of the flaws -> each flaw's `signs` appear in the
#     deliverables exactly when that flaw is active (check_signs.py)
# Suite-level: 12 tasks, 4 per domain, one held-out task per domain.
#
# Usage: examples/tasks/selftest.sh [task-id ...]     (PYTHON=python3.11 to pick the interpreter)
# Prints one line per test, then "N passed, M failed"; exits non-zero on any failure.
set -u

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONDONTWRITEBYTECODE=1
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
START=$(date +%s)

pass=0
fail=0
ok()  { pass=$((pass + 1)); printf '  ok    %s\n' "$1"; }
bad() { fail=$((fail + 1)); printf '  FAIL  %s\n' "$1"; [ -n "${2:-}" ] && printf '        %s\n' "$2"; return 0; }

# fresh_ws TASKDIR -> path of a new workspace holding files/ (no checks/)
fresh_ws() {
    local ws
    ws="$(mktemp -d "$TMP/ws.XXXXXX")"
    cp -R "$1/files/." "$ws/"
    printf '%s' "$ws"
}

# validate WS TIMEOUT -> sets VRC (exit code) and VOUT (combined output);
# MASS_CHECKS names the current task's checks folder (set per task below)
validate() {
    VOUT="$(cd "$1" && timeout "$2" "$PY" -I "$MASS_CHECKS/validate.py" 2>&1)"
    VRC=$?
}

# well_formed: the output obeys the line protocol and shows no traceback
well_formed() {
    if printf '%s\n' "$VOUT" | grep -q 'Traceback'; then return 1; fi
    printf '%s\n' "$VOUT" | tail -n 1 | grep -Eq '^SCORE [0-9]+/[0-9]+$' || return 1
    ! printf '%s\n' "$VOUT" | sed '$d' | grep -Evq '^(PASS|FAIL) [^ ]+: '
}

# solve WS TASKDIR [FLAW] -> runs the reference solver in WS
solve() {
    if [ -n "${3:-}" ]; then
        (cd "$1" && "$PY" "$2/solution/solve.py" --flaw "$3") >"$1/.solver.out" 2>&1
    else
        (cd "$1" && "$PY" "$2/solution/solve.py") >"$1/.solver.out" 2>&1
    fi
}

# ---------------------------------------------------------------- contract check
# Prints "OK <timeout>" and then one "FLAW <name> <caught>" line per flaw, or ERR lines.
contract() {
    "$PY" - "$1" <<'PYEOF'
import os, sys, tomllib
t = sys.argv[1]
tid = os.path.basename(t)
errs = []
try:
    with open(os.path.join(t, "task.toml"), "rb") as f:
        task = tomllib.load(f)
except Exception as e:  # noqa: BLE001
    print(f"ERR task.toml unreadable: {e}")
    sys.exit(0)
if task.get("id") != tid:
    errs.append(f"id {task.get('id')!r} != folder name {tid!r}")
if task.get("domain") not in ("finance", "robotics", "pharmacy"):
    errs.append(f"bad domain {task.get('domain')!r}")
if task.get("split") not in ("train", "heldout"):
    errs.append(f"bad split {task.get('split')!r}")
for key in ("title", "deliverables", "protected", "checks", "flaws"):
    if not task.get(key):
        errs.append(f"missing {key}")
for rel in task.get("protected", []):
    if not os.path.isfile(os.path.join(t, "files", rel)):
        errs.append(f"protected file files/{rel} missing")
flaws = task.get("flaws", [])
if not 2 <= len(flaws) <= 4:
    errs.append(f"{len(flaws)} flaws (need 2-4)")
if not any(fl.get("caught_by_checks") is False for fl in flaws):
    errs.append("no flaw with caught_by_checks = false")
for fl in flaws:
    if not fl.get("name") or not fl.get("description") or not isinstance(fl.get("caught_by_checks"), bool):
        errs.append(f"incomplete flaw {fl}")
    if fl.get("caught_by_checks") is False and not fl.get("evidence"):
        errs.append(f"flaw {fl.get('name')} is not caught by the checks but has no evidence phrase")
checks = task.get("checks", [])
if not checks or checks[0].get("command") != 'python3 -I "$MASS_CHECKS/validate.py"':
    errs.append("checks[0].command must be 'python3 -I \"$MASS_CHECKS/validate.py\"'")
for rel in ("prompt.md", "solution/solve.py", "checks/validate.py"):
    if not os.path.isfile(os.path.join(t, rel)):
        errs.append(f"{rel} missing")
size = 0
for root, dirs, files in os.walk(t):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    size += sum(os.path.getsize(os.path.join(root, f)) for f in files)
if size >= 150 * 1024:
    errs.append(f"task folder is {size} bytes (limit 150 KB)")
if errs:
    for e in errs:
        print("ERR " + e)
else:
    print(f"OK {int(checks[0].get('timeout_secs', 30))} {task['domain']} {task['split']} {size}")
    print(f"PROT {task['protected'][0]}")
    for fl in flaws:
        print(f"FLAW {fl['name']} {str(fl['caught_by_checks']).lower()}")
    for fl in flaws:
        if fl.get("evidence"):
            print(f"EVIDENCE {fl['name']} {fl['evidence']}")
PYEOF
}

# malformed results.json variants, derived from a good one: prints file names
make_malformed() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, os, sys
src, out = sys.argv[1], sys.argv[2]
good = json.load(open(src))
def strings(x):
    if isinstance(x, dict): return {k: strings(v) for k, v in x.items()}
    if isinstance(x, list): return [strings(v) for v in x]
    if isinstance(x, bool) or x is None: return x
    if isinstance(x, (int, float)): return str(x)
    return x
def nulls(x, depth=0):
    if isinstance(x, dict): return {k: (None if depth >= 1 else nulls(v, depth + 1)) for k, v in x.items()}
    return None
def lists(x):
    if isinstance(x, dict): return {k: lists(v) for k, v in x.items()}
    if isinstance(x, list): return {"0": x}
    if isinstance(x, (int, float)) and not isinstance(x, bool): return [x]
    return x
variants = {
    "not_json": "{not json",
    "array": "[]",
    "nan": json.dumps({k: float("nan") for k in good}) if isinstance(good, dict) else "NaN",
    "strings": json.dumps(strings(good)),
    "nulls": json.dumps(nulls(good)),
    "wrapped": json.dumps(lists(good)),
}
for name, text in variants.items():
    with open(os.path.join(out, name + ".json"), "w") as f:
        f.write(text)
    print(name)
PYEOF
}

# ---------------------------------------------------------------- main loop
if [ $# -gt 0 ]; then
    TASKS=("$@")
else
    TASKS=()
    for d in "$HERE"/*/; do
        [ -f "$d/task.toml" ] && TASKS+=("$(basename "$d")")
    done
fi

# run_task TID: all tests of one task; prints "  ok"/"  FAIL" lines (run in the background)
run_task() {
    local tid="$1" tdir="$HERE/$1" info tmo domain split size ws refws first v mws prot fname caught
    export MASS_CHECKS="$tdir/checks"
    echo "== $tid"
    info="$(contract "$tdir")"
    if ! printf '%s\n' "$info" | head -n 1 | grep -q '^OK '; then
        bad "$tid: folder contract" "$(printf '%s' "$info" | tr '\n' ';')"
        return
    fi
    read -r _ tmo domain split size <<<"$(printf '%s\n' "$info" | head -n 1)"
    echo "$tid $domain $split" >"$TMP/$tid.suite"
    ok "$tid: folder contract ($domain/$split, $size bytes)"

    # reference solution
    ws="$(fresh_ws "$tdir")"
    refws=""
    if solve "$ws" "$tdir"; then
        refws="$ws"
        validate "$ws" "$tmo"
        if [ "$VRC" -eq 0 ] && well_formed; then
            ok "$tid: reference solution passes ($(printf '%s\n' "$VOUT" | tail -n 1))"
        else
            bad "$tid: reference solution (validate exit $VRC)" "$(printf '%s\n' "$VOUT" | grep -E '^FAIL|Traceback' | head -n 3 | tr '\n' ';')"
        fi
        first="$VOUT"
        validate "$ws" "$tmo"
        if [ "$VOUT" = "$first" ]; then ok "$tid: validator is deterministic"; else bad "$tid: validator output differs between runs"; fi

        # malformed deliverables
        mkdir -p "$ws/.variants"
        for v in $(make_malformed "$ws/results.json" "$ws/.variants"); do
            mws="$(fresh_ws "$tdir")"
            cp "$ws/report.md" "$ws/logs.txt" "$mws/"
            cp "$ws/.variants/$v.json" "$mws/results.json"
            validate "$mws" "$tmo"
            if [ "$VRC" -eq 1 ] && well_formed; then
                ok "$tid: malformed results.json ($v) -> exit 1"
            else
                bad "$tid: malformed results.json ($v) -> exit $VRC" "$(printf '%s\n' "$VOUT" | grep -E 'Traceback|Error' | head -n 2 | tr '\n' ';')"
            fi
        done
        mws="$(fresh_ws "$tdir")"
        printf 'x' >"$mws/report.md"; : >"$mws/logs.txt"; printf '{"x": 1}' >"$mws/results.json"
        validate "$mws" "$tmo"
        if [ "$VRC" -eq 1 ] && well_formed; then ok "$tid: trivial deliverables -> exit 1"; else bad "$tid: trivial deliverables -> exit $VRC"; fi

        # tampered protected file
        prot="$(printf '%s\n' "$info" | sed -n 's/^PROT //p')"
        printf '\n' >>"$ws/$prot"
        validate "$ws" "$tmo"
        if [ "$VRC" -eq 1 ] && printf '%s\n' "$VOUT" | grep -q "^FAIL protected:$prot:"; then
            ok "$tid: tampering with $prot is detected"
        else
            bad "$tid: tampering with $prot not detected (exit $VRC)"
        fi
    else
        bad "$tid: reference solver crashed" "$(tail -n 3 "$ws/.solver.out" | tr '\n' ';')"
    fi

    # missing deliverables
    ws="$(fresh_ws "$tdir")"
    validate "$ws" "$tmo"
    if [ "$VRC" -eq 2 ] && well_formed; then ok "$tid: empty workspace -> exit 2"; else bad "$tid: empty workspace -> exit $VRC"; fi

    # flaws
    while read -r _ fname caught; do
        ws="$(fresh_ws "$tdir")"
        if ! solve "$ws" "$tdir" "$fname"; then
            bad "$tid: solver crashed with --flaw $fname" "$(tail -n 3 "$ws/.solver.out" | tr '\n' ';')"
            continue
        fi
        validate "$ws" "$tmo"
        if ! well_formed; then
            bad "$tid: flaw $fname: malformed validator output"
        elif [ "$caught" = true ] && [ "$VRC" -eq 1 ]; then
            ok "$tid: flaw $fname is caught ($(printf '%s\n' "$VOUT" | tail -n 1))"
        elif [ "$caught" = false ] && [ "$VRC" -eq 0 ]; then
            if [ -n "$refws" ] && cmp -s "$ws/report.md" "$refws/report.md" && cmp -s "$ws/logs.txt" "$refws/logs.txt"; then
                bad "$tid: flaw $fname passes but changes nothing (report.md and logs.txt identical to the reference)"
            else
                ok "$tid: flaw $fname passes the checks (documented blind spot; report differs from reference)"
            fi
            # What a judge can see of it: the evidence phrase is in this
            # report and not in the reference one.
            ev="$(printf '%s\n' "$info" | sed -n "s/^EVIDENCE $fname //p")"
            if [ -z "$ev" ]; then
                bad "$tid: flaw $fname has no evidence phrase"
            elif ! grep -qF -- "$ev" "$ws/report.md"; then
                bad "$tid: flaw $fname: evidence \"$ev\" is not in the flawed report.md"
            elif [ -n "$refws" ] && grep -qF -- "$ev" "$refws/report.md"; then
                bad "$tid: flaw $fname: evidence \"$ev\" is also in the reference report.md"
            else
                ok "$tid: flaw $fname shows its evidence in report.md"
            fi
        else
            bad "$tid: flaw $fname: validate exit $VRC, expected $([ "$caught" = true ] && echo 1 || echo 0)" \
                "$(printf '%s\n' "$VOUT" | grep -E '^FAIL' | head -n 2 | tr '\n' ';')"
        fi
    done < <(printf '%s\n' "$info" | grep '^FLAW ')

    # signs: what the simulated judge can perceive of each flaw (every flaw combination)
    local sout src
    sout="$(JOBS=1 "$PY" "$HERE/check_signs.py" "$tid" 2>&1)"
    src=$?
    printf '%s\n' "$sout" | grep -E '^  (ok|FAIL) '
    if [ "$src" -ne 0 ] && ! printf '%s\n' "$sout" | grep -q '^  FAIL '; then
        bad "$tid: check_signs.py exited $src" "$(printf '%s\n' "$sout" | tail -n 2 | tr '\n' ';')"
    fi
}

# Tasks run concurrently (JOBS at a time, default: number of CPUs); output is
# printed per task, in order, once all have finished.
JOBS="${JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"
running=0
for tid in "${TASKS[@]}"; do
    run_task "$tid" >"$TMP/$tid.log" 2>&1 &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait
SUITE="$TMP/suite.txt"
: >"$SUITE"
for tid in "${TASKS[@]}"; do
    cat "$TMP/$tid.log"
    [ -f "$TMP/$tid.suite" ] && cat "$TMP/$tid.suite" >>"$SUITE"
    pass=$((pass + $(grep -c '^  ok ' "$TMP/$tid.log")))
    fail=$((fail + $(grep -c '^  FAIL ' "$TMP/$tid.log")))
done

# ---------------------------------------------------------------- suite composition
if [ $# -eq 0 ]; then
    echo "== suite"
    comp="$("$PY" - "$SUITE" <<'PYEOF'
import sys
rows = [ln.split() for ln in open(sys.argv[1]) if ln.strip()]
errs = []
if len(rows) != 12:
    errs.append(f"{len(rows)} tasks (expected 12)")
for dom in ("finance", "robotics", "pharmacy"):
    d = [r for r in rows if r[1] == dom]
    h = [r for r in d if r[2] == "heldout"]
    if len(d) != 4 or len(h) != 1:
        errs.append(f"{dom}: {len(d)} tasks, {len(h)} held out (expected 4 and 1)")
print("; ".join(errs) if errs else f"12 tasks, 4 per domain, held out: " + ", ".join(r[0] for r in rows if r[2] == "heldout"))
PYEOF
)"
    case "$comp" in
        12\ tasks*) ok "suite composition: $comp" ;;
        *) bad "suite composition" "$comp" ;;
    esac
fi

echo
echo "elapsed $(($(date +%s) - START)) s"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
