#!/usr/bin/env bash
# Train on one machine with all of its local accelerators (GPUs, a single-host TPU VM, or the CPU):
# one process, the mesh spans every local device (docs/launch.md).
#
#   bash launch/single_host.sh --config=configs/sft.py:qwen3_5_9b \
#       --config.model.hf_path=/ckpt/Qwen3.5-9B --config.data.path=/data/reterm-10k --workdir=runs/sft-9b
#   CUDA_VISIBLE_DEVICES=0,1 bash launch/single_host.sh ...     # a subset of the GPUs
#
# RETERM_DISTRIBUTED=0 keeps maybe_initialize() from joining a cluster even inside a SLURM
# allocation or an MPI job (this script is the single-process path). SETUP=1 runs
# launch/setup.sh first (Python packages, Docker engine and base image; needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$#" -eq 0 ]; then
  echo "usage: bash launch/single_host.sh --config=configs/sft.py[:preset] [--config.x=y ...] [--workdir=DIR]" >&2
  exit 2
fi
if [ "${SETUP:-0}" = 1 ]; then
  bash launch/setup.sh
fi
export RETERM_DISTRIBUTED=0
python3 -c 'import jax; print(f"== {jax.device_count()} x {jax.devices()[0].device_kind} ({jax.default_backend()})")'
exec python3 -m reterm_jax.train "$@"
