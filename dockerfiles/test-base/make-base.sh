#!/bin/sh
# Build the local stand-in for a CANN image: a minimal Debian bookworm with python3, pip, venv,
# setuptools, wheel and git, imported into the Docker Engine. Nothing can be pulled here.
set -eu

TAG="${1:-bisect-precision-test-base:bookworm}"
if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "$TAG already exists"
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
    --include=python3,python3-pip,python3-venv,python3-setuptools,python3-wheel,git,ca-certificates \
    bookworm "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || { tail -30 "$ROOT.log" >&2; exit 1; }
rm -f "$ROOT.log"
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
tar -C "$ROOT" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    --message 'bisect-precision-docker test base image' \
    - "$TAG"
echo "imported $TAG"
