#!/usr/bin/env bash
# The bisect step of .github/workflows/bisect.yml. Every input arrives as an environment variable
# (never expanded into the script text), the session lives in a persistent directory keyed by the
# inputs so that re-running the workflow resumes from the ledger, one lock per device keeps two
# bisects off one card on this machine, and the tool's exit code becomes an annotation.
#
# Environment: PYPTO_DIR LIB_DIR GOOD BAD SCRIPT PLATFORM DEVICE BASE_IMAGE (required);
# PYPTO_REPOSITORY LIB_REPOSITORY DEVICE_MODE CONFIDENCE REPEAT CONFIG STATE_DIR NEW_SESSION TOOL
# (optional);
# GITHUB_OUTPUT GITHUB_STEP_SUMMARY (set by the runner; a file each).
# Exit: 0 culprit found or inconclusive (a warning), else the tool's exit code.
set -uo pipefail

for name in PYPTO_DIR LIB_DIR GOOD BAD SCRIPT PLATFORM DEVICE BASE_IMAGE \
    GITHUB_OUTPUT GITHUB_STEP_SUMMARY; do
    if [ -z "${!name:-}" ]; then
        echo "::error title=bisect::${name} is empty"
        exit 2
    fi
done
TOOL="${TOOL:-bisect-precision-docker}"

# Workflow-command data: % and newlines escaped, and in properties also ':' and ','.
escape_data() { local s="${1//'%'/'%25'}"; s="${s//$'\r'/'%0D'}"; printf '%s' "${s//$'\n'/'%0A'}"; }
escape_property() { local s; s="$(escape_data "$1")"; s="${s//:/%3A}"; printf '%s' "${s//,/%2C}"; }
annotate() { echo "::$1 title=$(escape_property "$2")::$(escape_data "$3")"; }

state="${STATE_DIR:-~/bisect-precision}"
case "$state" in
    "~") state="$HOME" ;;
    "~/"*) state="$HOME/${state#\~/}" ;;
esac
case "$state" in
    /*) ;;
    *) state="$PWD/$state" ;;
esac
if [ -n "${RUNNER_TEMP:-}" ]; then
    case "$state/" in
        "$RUNNER_TEMP"/*)
            annotate error "bisect: state_dir" \
                "state_dir $state is inside RUNNER_TEMP, which the runner empties before every job: a rerun could not resume; pick a persistent directory"
            exit 2
            ;;
    esac
fi

# The config file's text is an input too (it may live in pypto-lib, which a rerun checks out at
# the session's first commit): an edited config starts a session of its own instead of being
# refused by the ledger, or rolled back with pypto-lib and never read.
config_text=""
if [ -n "${CONFIG:-}" ] && [ -f "$CONFIG" ]; then
    config_text="$(sha256sum <"$CONFIG" | cut -c1-16)"
fi

# The same inputs give the same workdir: a rerun resumes the session its ledger holds.
key="$(printf '%s\0' "${PYPTO_REPOSITORY:-}" "${LIB_REPOSITORY:-}" "$GOOD" "$BAD" "$SCRIPT" \
    "$PLATFORM" "$DEVICE" "$BASE_IMAGE" "${DEVICE_MODE:-}" "${CONFIDENCE:-}" "${REPEAT:-}" \
    "${CONFIG:-}" "$config_text" |
    sha256sum | cut -c1-16)"
workdir="$state/sessions/$key"
cache="$state/cache"
mkdir -p "$workdir/logs" "$cache" "$state/locks" || exit 4
{
    echo "workdir=$workdir"
    echo "key=$key"
} >>"$GITHUB_OUTPUT"
printf '%s\n' "pypto_repository=${PYPTO_REPOSITORY:-}" "lib_repository=${LIB_REPOSITORY:-}" \
    "good=$GOOD" "bad=$BAD" "script=$SCRIPT" "platform=$PLATFORM" "device=$DEVICE" \
    "base_image=$BASE_IMAGE" "device_mode=${DEVICE_MODE:-}" "confidence=${CONFIDENCE:-}" \
    "repeat=${REPEAT:-}" "config=${CONFIG:-}" "config_sha256=$config_text" >"$workdir/inputs.txt"
echo "session $key in $workdir (wheel cache $cache)"

# Starting over: the earlier session's ledger and reports are kept by the tool (`--session`),
# and HEAD and pypto-lib are taken as they are now.
new_session=false
if [ "${NEW_SESSION:-false}" = "true" ]; then
    new_session=true
    rm -f "$workdir/bad-revision" "$workdir/lib-revision"
    echo "a new session: the earlier one stays readable with --session"
fi

# A symbolic bad revision (HEAD, a branch) is resolved once and kept: new commits landing between
# two reruns must not change the session's inputs, or the ledger would refuse to resume.
bad="$BAD"
if ! [[ "$bad" =~ ^[0-9a-f]{40}$ ]]; then
    if [ -s "$workdir/bad-revision" ]; then
        bad="$(cat "$workdir/bad-revision")"
        echo "bad = $BAD, resolved by the first run of this session to $bad"
    elif resolved="$(git -C "$PYPTO_DIR" rev-parse --verify --quiet "$BAD^{commit}")"; then
        bad="$resolved"
        echo "$bad" >"$workdir/bad-revision"
        echo "bad = $BAD, resolved to $bad (kept for reruns)"
    fi
fi

# pypto-lib (the example and its goldens) is part of the session too: the first run's commit is
# kept, so a rerun after pypto-lib moved on resumes the session instead of being refused.
if lib_head="$(git -C "$LIB_DIR" rev-parse --verify --quiet HEAD 2>/dev/null)"; then
    if [ -s "$workdir/lib-revision" ]; then
        kept="$(cat "$workdir/lib-revision")"
        if [ "$kept" != "$lib_head" ]; then
            if ! git -C "$LIB_DIR" checkout -q --detach "$kept" 2>/dev/null; then
                annotate error "bisect: bad input" \
                    "pypto-lib moved since this session started at $kept, and that commit is not in the checkout; fetch it, or remove $workdir to start over"
                exit 2
            fi
            echo "pypto-lib at $kept, as in the first run of this session (its HEAD is $lib_head)"
        fi
    else
        echo "$lib_head" >"$workdir/lib-revision"
    fi
fi

args=(run --pypto "$PYPTO_DIR" --lib "$LIB_DIR" --script "$SCRIPT" --good "$GOOD" --bad "$bad"
    --platform "$PLATFORM" --device "$DEVICE" --base-image "$BASE_IMAGE"
    --workdir "$workdir" --cache-dir "$cache")
if [ -n "${DEVICE_MODE:-}" ]; then args+=(--device-mode "$DEVICE_MODE"); fi
# Settings without a flag of their own reach the tool as BISECT_PRECISION_<KEY>.
if [ -n "${CONFIDENCE:-}" ]; then export BISECT_PRECISION_CONFIDENCE="$CONFIDENCE"; fi
if [ -n "${REPEAT:-}" ]; then export BISECT_PRECISION_REPEAT="$REPEAT"; fi
if [ -n "${CONFIG:-}" ]; then args+=(--config "$CONFIG"); fi
if [ "$new_session" = true ]; then args+=(--new-session); fi

# One bisect per device on this machine, whichever repository or workflow started it.
if ! command -v flock >/dev/null 2>&1; then
    annotate error "bisect: infrastructure failure" \
        "flock (util-linux) is missing on this runner; it keeps two bisects off one device"
    echo "infrastructure=true" >>"$GITHUB_OUTPUT"
    exit 4
fi
# One lock per card, taken in card order (so two jobs sharing cards cannot deadlock): DEVICE=0,1
# and DEVICE=1 exclude each other, as two bisects on card 1 would share it.
IFS=, read -r -a cards <<<"$DEVICE"
mapfile -t cards < <(printf '%s\n' "${cards[@]}" | tr -cd '0-9\n' | sort -n -u)
for card in "${cards[@]}"; do
    [ -n "$card" ] || continue
    lock="$state/locks/device-$card.lock"
    exec {fd}>"$lock"
    if ! flock -n "$fd"; then
        echo "another bisect holds card $card on this machine ($lock); waiting for it"
        flock "$fd"
    fi
done

started="$workdir/logs/.started"
touch "$started"
log="$workdir/logs/run-$(date -u +%Y%m%dT%H%M%SZ).log"
# Nothing the tool or an example prints can act as a workflow command.
token="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
echo "::stop-commands::$token"
"$TOOL" "${args[@]}" 2>&1 | tee "$log"
status="${PIPESTATUS[0]}"
echo "::$token::"

echo "exit-code=$status" >>"$GITHUB_OUTPUT"
message="$(grep '^error: ' "$log" | tail -n 1 | cut -c8-)"
case "$status" in
    0)
        annotate notice "bisect: culprit found" "$(grep -m1 -E '^(first bad|simpler commit)' "$log" || echo 'see the job summary')"
        ;;
    1)
        why="$(grep -m1 -E '^note: (inconclusive|[0-9]+ [a-z0-9 ]*candidates? could not be tested)' "$log" | cut -c7-)"
        annotate warning "bisect: inconclusive (exit 1)" \
            "${why:-untestable commits border the culprit}; the report in the job summary gives the candidates"
        status=0
        ;;
    2)
        annotate error "bisect: bad input (exit 2)" "${message:-see the log}"
        ;;
    3)
        annotate error "bisect: the endpoints or the environment do not reproduce (exit 3)" "${message:-see the log}"
        ;;
    4)
        annotate error "bisect: infrastructure failure (exit 4)" "${message:-see the log}"
        echo "infrastructure=true" >>"$GITHUB_OUTPUT"
        ;;
    *)
        annotate error "bisect: stopped (exit $status)" "${message:-see the log}"
        ;;
esac

if [ "$workdir/report.md" -nt "$started" ]; then
    cat "$workdir/report.md" >>"$GITHUB_STEP_SUMMARY"
else
    {
        echo "## bisect: no report from this run (exit $status)"
        echo
        echo "${message:-The tool stopped before it wrote a report; see the job log.}"
    } >>"$GITHUB_STEP_SUMMARY"
fi
exit "$status"
