#!/bin/sh
# Download the test suite's build tools for the test base image's Python (bookworm: 3.11) into a
# wheelhouse, so that builders are provisioned without any index during the tests.
set -eu
PYTHON="$1"
DEST="$2"
LIST="$(dirname "$0")/wheelhouse.txt"
STAMP="$DEST/.complete"
want="$(sha256sum "$LIST" | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    echo "$DEST is up to date"
    exit 0
fi
ARCH="$(uname -m)"
mkdir -p "$DEST"
grep -v '^\s*#' "$LIST" | grep -v '^\s*$' | while read -r requirement; do
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --python-version 3.11 --implementation cp \
        --abi cp311 --abi abi3 --abi none \
        --platform "manylinux_2_17_$ARCH" --platform "manylinux2014_$ARCH" \
        --dest "$DEST" "$requirement"
done
echo "$want" >"$STAMP"
ls "$DEST"
