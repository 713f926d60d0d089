#!/usr/bin/env bash
# Prints the path of a promtool, fetching Debian's (from the `prometheus` package, unpacked into
# the machine cache, never installed: installing would start a Prometheus server) when none is on
# PATH. Used by scripts/test.sh to check deploy/prometheus/alerts.yml and, through
# node/tests/metrics.rs, a live replica's /metrics exposition.
set -euo pipefail
source "$(dirname "$0")/env.sh"
if command -v promtool >/dev/null; then
  command -v promtool
  exit 0
fi
dir="${PREFIXLOG_CACHE:-$HOME/.cache/prefixlog}/tools/prometheus"
if [ ! -x "$dir/usr/bin/promtool" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1) || {
    $SUDO apt-get update -qq
    (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1)
  }
  mkdir -p "$dir"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$dir"
fi
echo "$dir/usr/bin/promtool"
