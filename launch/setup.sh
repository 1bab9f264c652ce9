#!/usr/bin/env bash
# One-time setup of a machine for reterm_jax (idempotent; a second run is fast):
#   1. Debian packages: docker.io (the sandbox engine) and debootstrap (offline base image);
#   2. Python packages from requirements.txt and this package in editable mode;
#   3. a running Docker engine (launch/start_docker.sh);
#   4. the offline base image reterm/base:bookworm (launch/build_base_image.sh, cached);
#   5. with RETERM_RUNSC=1 (or =try), gVisor's runsc registered as a sandbox runtime.
# Needs root (or sudo) for steps 1, 3 and 4. Python packages go into the active Python
# environment: activate a virtualenv first if you want them isolated.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup needs root or sudo for apt-get and dockerd" >&2; exit 1; }
  SUDO="sudo"
fi

need_apt=""
command -v dockerd >/dev/null || need_apt="$need_apt docker.io"
command -v debootstrap >/dev/null || need_apt="$need_apt debootstrap"
if [ -n "$need_apt" ]; then
  echo "== apt-get install$need_apt"
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need_apt >/dev/null
fi

echo "== pip install -r requirements.txt"
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps -e .

echo "== docker engine"
$SUDO bash launch/start_docker.sh
echo "== base image"
$SUDO bash launch/build_base_image.sh

# 5. optional: gVisor (runsc) as a second sandbox runtime (--config.sandbox.runtime=runsc).
#    RETERM_RUNSC=1: required; RETERM_RUNSC=try: a failure only warns (the runsc tests then skip).
case "${RETERM_RUNSC:-0}" in
  1) echo "== gVisor runtime"; $SUDO bash launch/register_runsc.sh ;;
  try) echo "== gVisor runtime (optional)"
       $SUDO bash launch/register_runsc.sh || echo "warning: runsc could not be registered; its tests will skip" >&2 ;;
esac
