#!/usr/bin/env bash
# Build the offline base image reterm/base:bookworm without any registry:
# debootstrap a minimal Debian bookworm, install the tools terminal tasks expect,
# and `docker import` the root filesystem. Bundled tasks build FROM this image.
#
# Cached: the image carries a label with the hash of this script; when an image
# with the same hash exists, nothing is rebuilt. Pass --force to rebuild.
#
# Needs root, debootstrap (apt-get install -y debootstrap) and a running Docker
# engine (launch/start_docker.sh). Mirror: $RETERM_DEBIAN_MIRROR or deb.debian.org.
set -euo pipefail

IMAGE=${RETERM_BASE_IMAGE:-reterm/base:bookworm}
MIRROR=${RETERM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES="bash coreutils findutils grep sed gawk diffutils patch file less procps psmisc \
ca-certificates python3 python3-pytest python3-venv git sqlite3 gcc libc6-dev make \
tar gzip bzip2 xz-utils zip unzip jq curl vim-tiny nano cron bc time"

recipe_hash=$( { cat "$0"; echo "$MIRROR"; } | sha256sum | cut -c1-16)
if [ "${1:-}" != "--force" ]; then
  have=$(docker image inspect "$IMAGE" --format '{{ index .Config.Labels "reterm_jax.recipe" }}' 2>/dev/null || true)
  if [ "$have" = "$recipe_hash" ]; then
    echo "$IMAGE is up to date (recipe $recipe_hash)"
    exit 0
  fi
fi
for tool in debootstrap docker; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install -y ${tool/docker/docker.io}" >&2; exit 1; }
done

rootfs=$(mktemp -d /tmp/reterm-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap bookworm into $rootfs ..."
debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >/tmp/reterm-debootstrap.log 2>&1 \
  || { tail -n 30 /tmp/reterm-debootstrap.log >&2; exit 1; }

echo "installing task tools in the chroot ..."
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
echo "deb $MIRROR bookworm main" >"$rootfs/etc/apt/sources.list"
mount -t proc proc "$rootfs/proc"
trap 'umount "$rootfs/proc" 2>/dev/null || true; rm -rf "$rootfs"' EXIT
# shellcheck disable=SC2086
chroot "$rootfs" /bin/bash -c "export DEBIAN_FRONTEND=noninteractive LC_ALL=C; \
  apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null \
  && apt-get clean && rm -rf /var/lib/apt/lists/*" \
  || { echo "package install in chroot failed" >&2; exit 1; }
umount "$rootfs/proc"
: >"$rootfs/etc/resolv.conf"
mkdir -p "$rootfs/logs/verifier" "$rootfs/app"

echo "importing $IMAGE ..."
tar -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'WORKDIR /app' \
  --change 'CMD ["/bin/bash"]' \
  --change "LABEL reterm_jax.recipe=$recipe_hash" \
  - "$IMAGE" >/dev/null
echo "built $IMAGE (recipe $recipe_hash), $(docker image inspect "$IMAGE" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')"
