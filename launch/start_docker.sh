#!/usr/bin/env bash
# Start a local Docker engine if none answers, and wait for its socket.
# Used by .ci/run, the quickstart and the tests' README. Safe to call twice.
#
# Machines without a bridge network or registry (like this project's CI) run the
# engine with --bridge=none --iptables=false: builds and `docker run` still work,
# and no container gets a network. Set RETERM_DOCKERD_ARGS to override.
set -euo pipefail

if docker info >/dev/null 2>&1; then
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "dockerd not found. Install it: apt-get install -y docker.io (as root)" >&2
  exit 1
fi
args=${RETERM_DOCKERD_ARGS:---bridge=none --iptables=false}
log=${RETERM_DOCKERD_LOG:-/tmp/reterm-dockerd.log}
# shellcheck disable=SC2086
nohup dockerd $args >"$log" 2>&1 &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "dockerd did not answer within 60 s; see $log" >&2
tail -n 20 "$log" >&2 || true
exit 1
