#!/bin/sh
# One step of the manual bisect, run by `git bisect run` (exit 0 good, 1 bad, 125 skip).
#   step.sh pypto          at the pypto commit checked out: update the runtime submodule,
#                          install pypto and simpler editable, run the example
#   step.sh simpler        at the simpler commit checked out in /ws/pypto/runtime (pypto pinned):
#                          install simpler editable, run the example
#   step.sh install-pypto  only install the pypto checked out (the second level's pin)
set -u
MODE="$1"
LOG=/ws/build.log
stamp() { echo "BENCH $* $(date +%s.%N)"; }
install() {  # install $1 (a directory) editable; a build failure makes the commit untestable
    stamp build-start "$2" "$(git -C "$1" rev-parse HEAD)"
    if ! python3 -m pip install --no-build-isolation --no-index --no-deps -e "$1" >>"$LOG" 2>&1; then
        stamp build-failed "$2"
        return 1
    fi
    stamp build-end "$2"
}

cd /ws/pypto
case "$MODE" in
    pypto)
        install /ws/pypto pypto || exit 125
        if git rev-parse -q --verify HEAD:runtime >/dev/null; then  # older commits have none
            git submodule update --init runtime >/dev/null 2>&1 || exit 125
            install /ws/pypto/runtime simpler || exit 125
        fi
        ;;
    simpler)
        install /ws/pypto/runtime simpler || exit 125
        ;;
    install-pypto)
        install /ws/pypto pypto || exit 2
        exit 0
        ;;
esac

stamp run-start "$(git rev-parse HEAD)"
cd /ws/pypto-lib
PYTHONPATH=/ws/pypto-lib python3 "$SCRIPT" -p "$PLATFORM" -d "$DEVICE" >/ws/run.log 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then
    verdict=good; code=0
elif grep -q "does not match golden" /ws/run.log; then
    verdict=bad; code=1
else
    verdict=skip; code=125
fi
stamp run-end "$verdict"
exit "$code"
