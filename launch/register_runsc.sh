#!/usr/bin/env bash
# Install gVisor's runsc (Debian's package) and register it with the local Docker engine as the
# runtime "runsc", so that --config.sandbox.runtime=runsc (or `sandbox check --runtime=runsc`)
# runs sandboxes under a user-space kernel. Idempotent. Needs root. Called by launch/setup.sh when
# RETERM_RUNSC=1 (or =try: a failure is then a warning, not an error).
#
# runtimeArgs: --network=none (sandboxes have no network, and runsc refuses to start under
# `dockerd --bridge=none` otherwise), --file-access=shared (files the harness copies in with
# `docker cp`, and the ones `docker commit` reads, are seen as they are on the host).
set -euo pipefail

if ! command -v runsc >/dev/null 2>&1; then
  echo "== apt-get install runsc"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null
fi
path=$(command -v runsc)
python3 - "$path" <<'PY'
import json, os, sys
path = "/etc/docker/daemon.json"
cfg = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
want = {"path": sys.argv[1], "runtimeArgs": ["--network=none", "--file-access=shared"]}
if cfg.get("runtimes", {}).get("runsc") != want:
    cfg.setdefault("runtimes", {})["runsc"] = want
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(cfg, fh, indent=2)
    print(f"registered runsc in {path}")
PY
# a running engine reloads its runtimes on SIGHUP; one started later reads daemon.json itself
if pid=$(pgrep -x dockerd); then
  kill -HUP $pid
  for _ in $(seq 1 20); do
    if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q runsc; then break; fi
    sleep 0.5
  done
fi
if docker info >/dev/null 2>&1; then
  docker info --format '{{json .Runtimes}}' | grep -q runsc || { echo "dockerd did not load runsc" >&2; exit 1; }
  echo "runsc: $(runsc --version 2>/dev/null | head -1)"
fi
