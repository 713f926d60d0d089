#!/usr/bin/env bash
# A Docker engine for the container test leg and the local-image stack (issue 18).
#
#   scripts/docker-engine.sh run CMD...   engine up, run CMD, engine down if this script started it
#   scripts/docker-engine.sh start        engine up, left running until `stop`
#   scripts/docker-engine.sh stop         stops a dockerd this script started (never another one)
#   scripts/docker-engine.sh status
#
# Installs Debian's docker.io if `dockerd` is missing (apt, non-interactive; root or sudo). If no
# engine answers `docker info`, starts `dockerd` in the background (no systemd on CI machines)
# with its log in ~/.cache/prefixlog/dockerd.log and waits up to 60 s for the socket.
# Only a dockerd this script started (its pid is in ~/.cache/prefixlog/docker-engine/) is ever
# stopped: `run` stops it when the command ends unless another `run` (a parallel test run on the
# same machine) still uses it or it was started with `start`. An engine that was already running
# (systemd, Docker Desktop, another user) is used and left alone.
set -euo pipefail
CACHE="$HOME/.cache/prefixlog"
STATE="$CACHE/docker-engine"     # pid of the dockerd we started, users of it
LOG="$CACHE/dockerd.log"
mkdir -p "$STATE/users"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

install_docker() {
  if command -v dockerd >/dev/null && command -v docker >/dev/null; then return; fi
  echo "==> installing docker.io (Debian's Docker engine, once per machine)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    docker.io >"$CACHE/docker-install.log" 2>&1 \
    || { tail -20 "$CACHE/docker-install.log" >&2; echo "error: apt-get install docker.io failed" >&2; exit 1; }
}

# Prints "started" when it started dockerd, "running" when an engine already answered (or a
# dockerd this script started for a parallel run was still starting).
start() {
  install_docker
  if engine_answers; then echo running; return; fi
  local pid how=running
  pid=$(cat "$STATE/dockerd.pid" 2>/dev/null || true)
  if [ -z "$pid" ] || ! $SUDO kill -0 "$pid" 2>/dev/null; then
    how=started
    echo "==> starting dockerd (log: $LOG)" >&2
    # setsid: not in this shell's process group, so Ctrl-C on a test run does not kill it
    # before the cleanup trap stops it properly.
    $SUDO setsid dockerd >>"$LOG" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$STATE/dockerd.pid"
  fi
  for _ in $(seq 1 120); do
    if engine_answers; then echo "$how"; return; fi
    if ! $SUDO kill -0 "$pid" 2>/dev/null; then
      rm -f "$STATE/dockerd.pid"
      echo "error: dockerd exited during startup; the end of $LOG:" >&2
      tail -30 "$LOG" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "error: dockerd did not answer within 60 s; the end of $LOG:" >&2
  tail -30 "$LOG" >&2
  exit 1
}

stop() {
  local pid
  pid=$(cat "$STATE/dockerd.pid" 2>/dev/null || true)
  if [ -z "$pid" ]; then echo "==> no dockerd started by this script; nothing to stop" >&2; return; fi
  if $SUDO kill -0 "$pid" 2>/dev/null; then
    echo "==> stopping dockerd (pid $pid)" >&2
    $SUDO kill -TERM "$pid" 2>/dev/null || true
    # dockerd stops its containers (10 s grace each) and its containerd.
    for _ in $(seq 1 300); do $SUDO kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if $SUDO kill -0 "$pid" 2>/dev/null; then
      echo "warning: dockerd (pid $pid) still running after 30 s; killing it" >&2
      $SUDO kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$STATE/dockerd.pid"
}

# Other live `run`s using the engine (their pid files; stale ones are removed).
other_users() {
  local n=0 f p
  for f in "$STATE"/users/*; do
    [ -e "$f" ] || continue
    p=$(basename "$f")
    if [ "$p" = "$$" ]; then continue; fi
    if kill -0 "$p" 2>/dev/null; then n=$((n + 1)); else rm -f "$f"; fi
  done
  echo "$n"
}

case "${1:-}" in
  start) start >/dev/null; touch "$STATE/keep"; echo "==> Docker engine up" ;;
  stop) rm -f "$STATE/keep"; stop ;;
  status)
    if engine_answers; then echo "engine answers ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
    else echo "no engine answers"; exit 1; fi ;;
  run)
    shift
    [ "$#" -gt 0 ] || { echo "usage: $0 run CMD..." >&2; exit 2; }
    touch "$STATE/users/$$"
    how=$(start)
    cleanup() {
      rm -f "$STATE/users/$$"
      if [ -e "$STATE/dockerd.pid" ] && [ ! -e "$STATE/keep" ]; then
        if [ "$(other_users)" = 0 ]; then stop
        else echo "==> leaving dockerd running: another run still uses it" >&2; fi
      fi
    }
    trap cleanup EXIT
    echo "==> Docker engine $how ($(docker version -f '{{.Server.Version}}' 2>/dev/null))" >&2
    "$@"
    ;;
  *) echo "usage: $0 run CMD... | start | stop | status" >&2; exit 2 ;;
esac
