#!/bin/sh
# Make sure a Docker Engine answers: install Debian's docker.io and start dockerd when none does.
set -eu

answers() { docker info >/dev/null 2>&1; }
# A live dockerd, not the zombie a killed one leaves until its parent reaps it.
dockerd_alive() { ps -C dockerd -o stat= 2>/dev/null | grep -qv '^Z'; }

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

daemon=""
if dockerd_alive; then
    echo "a dockerd is running but not answering yet; waiting for it"
else
    # A dockerd that was killed (a stopped session, a machine handed over) leaves pid files
    # behind, and a new dockerd refuses to start while they exist.
    for pidfile in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
        if [ -f "$pidfile" ]; then
            pid="$(cat "$pidfile" 2>/dev/null || true)"
            state="$(ps -o stat= -p "${pid:-0}" 2>/dev/null || true)"
            comm="$(ps -o comm= -p "${pid:-0}" 2>/dev/null || true)"
            case "$state:$comm" in
                Z*|:*) stale=yes ;;
                *:dockerd|*:containerd) stale=no ;;
                *) stale=yes ;;
            esac
            if [ "$stale" = yes ]; then
                echo "removing stale $pidfile"
                rm -f "$pidfile"
            fi
        fi
    done
    echo "starting dockerd in the background (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
    daemon=$!
fi

i=0
until answers; do
    i=$((i + 1))
    if [ -n "$daemon" ] && ! kill -0 "$daemon" 2>/dev/null; then
        echo "dockerd exited while starting; see /var/log/dockerd.log" >&2
        tail -20 /var/log/dockerd.log >&2 || true
        exit 1
    fi
    if [ "$i" -gt 60 ]; then
        echo "dockerd did not answer within 60 s; see /var/log/dockerd.log" >&2
        tail -20 /var/log/dockerd.log >&2 || true
        exit 1
    fi
    sleep 1
done
echo "Docker Engine $(docker version --format '{{.Server.Version}}') answers"
