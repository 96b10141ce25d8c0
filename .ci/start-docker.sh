#!/bin/sh
# Make sure a Docker Engine answers: install Debian's docker.io and start dockerd when none does.
set -eu

answers() { docker info >/dev/null 2>&1; }

if answers; then
    exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
    echo "installing Debian's docker.io"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
if ! command -v docker >/dev/null 2>&1; then
    echo "no docker client after installing docker.io" >&2
    exit 1
fi
echo "starting dockerd in the background (log: /var/log/dockerd.log)"
nohup dockerd >/var/log/dockerd.log 2>&1 &
i=0
until answers; do
    i=$((i + 1))
    if [ "$i" -gt 60 ]; then
        echo "dockerd did not answer within 60 s; see /var/log/dockerd.log" >&2
        tail -20 /var/log/dockerd.log >&2 || true
        exit 1
    fi
    sleep 1
done
echo "Docker Engine $(docker version --format '{{.Server.Version}}') answers"
