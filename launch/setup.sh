#!/usr/bin/env bash
# One-time setup of a machine for reterm_jax (idempotent; a second run is fast):
#   1. Debian packages: docker.io (the sandbox engine) and debootstrap (offline base image);
#   2. Python packages from requirements.txt and this package in editable mode;
#   3. a running Docker engine (launch/start_docker.sh);
#   4. the offline base image reterm/base:bookworm (launch/build_base_image.sh, cached).
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
