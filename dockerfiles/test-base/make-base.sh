#!/bin/sh
# Build the local stand-in for a CANN image: a minimal Debian bookworm with python3, pip, git, a
# C/C++ compiler, cmake, make and the Python headers, but no Python build backend (no setuptools,
# wheel, scikit-build-core, ninja or ccache), like a stock CANN image. Its entrypoint sources an
# environment script, as CANN's sources set_env.sh. Nothing can be pulled here.
set -eu

TAG="${1:-bisect-precision-test-base:bookworm}"
RECIPE=2  # bump when this script changes what the image holds
LABEL=bisect-precision-test-base.recipe
have="$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$TAG" 2>/dev/null || true)"
if [ "$have" = "$RECIPE" ]; then
    echo "$TAG already exists (recipe $RECIPE)"
    exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
ROOT="$(mktemp -d /var/tmp/bisect-precision-base.XXXXXX)"
trap 'rm -rf "$ROOT"' EXIT
MIRROR="$(sed -n 's/^URIs: *\(http[^ ]*debian\/*\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
echo "debootstrap bookworm from $MIRROR into $ROOT"
debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,python3-dev,git,ca-certificates,gcc,g++,make,cmake \
    bookworm "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || { tail -30 "$ROOT.log" >&2; exit 1; }
rm -f "$ROOT.log"
# Debian's pip depends on setuptools and wheel; a stock CANN image has no build backend, so drop
# them (pip installs wheels without either).
chroot "$ROOT" dpkg --force-depends --purge python3-setuptools python3-wheel >/dev/null 2>&1 || true
# The CANN images' entrypoint sources the toolkit's set_env.sh, then runs the command.
mkdir -p "$ROOT/usr/local/Ascend/ascend-toolkit"
cat >"$ROOT/usr/local/Ascend/ascend-toolkit/set_env.sh" <<'ENV'
export ASCEND_HOME_PATH=/usr/local/Ascend/ascend-toolkit/latest
export ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest
export BISECT_TEST_ENTRYPOINT=sourced
ENV
cat >"$ROOT/usr/local/bin/entrypoint.sh" <<'ENTRY'
#!/bin/sh
. /usr/local/Ascend/ascend-toolkit/set_env.sh
exec "$@"
ENTRY
chmod 755 "$ROOT/usr/local/bin/entrypoint.sh"
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
tar -C "$ROOT" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL $LABEL=$RECIPE" \
    --message 'bisect-precision-docker test base image' \
    - "$TAG"
echo "imported $TAG"
