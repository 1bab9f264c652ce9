#!/usr/bin/env bash
# Run one training command on every worker of a Cloud TPU VM pod slice (docs/launch.md).
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a bash launch/tpu_pod.sh \
#       --config=configs/sft.py:qwen3_5_9b --config.model.hf_path=/mnt/ckpt/Qwen3.5-9B \
#       --config.data.path=/mnt/data/reterm-10k --workdir=/mnt/runs/sft-9b
#
# On each worker (gcloud compute tpus tpu-vm ssh --worker=all): clone or update the repo at
# the commit checked out here, install the pinned requirements with the TPU build of JAX (SETUP),
# then `python3 -m reterm_jax.train ARGS` with RETERM_DISTRIBUTED=auto, so that
# maybe_initialize() calls jax.distributed.initialize() and JAX finds the slice's workers
# from the TPU metadata. Every worker runs the same command; process 0 logs and writes
# TensorBoard events; Orbax writes checkpoints from all workers into --workdir, which must be
# a filesystem every worker mounts at the same path (Filestore/NFS, or a gcsfuse mount).
#
# Settings (environment):
#   TPU_NAME, ZONE   the slice and its zone (required)
#   PROJECT          gcloud project (default: gcloud's configured one)
#   REPO_URL         git URL the workers clone (default: this checkout's `origin`)
#   REF              commit to run (default: this checkout's HEAD; push it first)
#   REMOTE_DIR       checkout dir on the workers (default: reterm_jax, in the login user's home)
#   SETUP            python (default): pip install -r requirements.txt, the package, jax[tpu];
#                    full: launch/setup.sh as well (Docker engine + base image, for GRPO sandboxes);
#                    none: skip
#   DETACH=1         run under nohup on the workers (log: REMOTE_DIR/train-<ref>.log) and return
#   EXTRA_ENV        more `NAME=value ...` exported before the command (e.g. RETERM_DOCKER_HOSTS=...)
set -euo pipefail
cd "$(dirname "$0")/.."

: "${TPU_NAME:?set TPU_NAME to the pod slice name}"
: "${ZONE:?set ZONE to the slice zone, e.g. us-east5-a}"
if [ "$#" -eq 0 ]; then
  echo "usage: TPU_NAME=... ZONE=... bash launch/tpu_pod.sh --config=configs/sft.py:qwen3_5_9b [--config.x=y ...] --workdir=DIR" >&2
  exit 2
fi
REPO_URL="${REPO_URL:-$(git remote get-url origin)}"
REF="${REF:-$(git rev-parse HEAD)}"
REMOTE_DIR="${REMOTE_DIR:-reterm_jax}"
SETUP="${SETUP:-python}"
JAX_VERSION="$(sed -n 's/^jax==//p' requirements.txt)"
case "$SETUP" in python|full|none) ;; *) echo "SETUP=$SETUP: use python, full or none" >&2; exit 2 ;; esac

args="$(printf '%q ' "$@")"
read -r -d '' remote <<EOF || true
set -euo pipefail
if [ ! -d $(printf '%q' "$REMOTE_DIR")/.git ]; then git clone --quiet $(printf '%q' "$REPO_URL") $(printf '%q' "$REMOTE_DIR"); fi
cd $(printf '%q' "$REMOTE_DIR")
git fetch --quiet origin && git checkout --quiet --detach $(printf '%q' "$REF")
if [ $SETUP != none ]; then
  python3 -m pip install -q -r requirements.txt
  python3 -m pip install -q --no-deps -e .
  python3 -m pip install -q "jax[tpu]==$JAX_VERSION"
fi
if [ $SETUP = full ]; then sudo bash launch/setup.sh; fi
export RETERM_DISTRIBUTED=auto ${EXTRA_ENV:-}
if [ "${DETACH:-0}" = 1 ]; then
  nohup python3 -m reterm_jax.train $args > train-${REF:0:12}.log 2>&1 < /dev/null &
  echo "\$(hostname): started, log \$PWD/train-${REF:0:12}.log"
else
  python3 -m reterm_jax.train $args
fi
EOF

gcloud_args=(compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all)
if [ -n "${PROJECT:-}" ]; then gcloud_args+=(--project "$PROJECT"); fi
echo "== $TPU_NAME ($ZONE): $REF on every worker" >&2
exec gcloud "${gcloud_args[@]}" --command "$remote"
