#!/usr/bin/env bash
# Set up the machine and run the main job on its embedded default.
#
# Today the main job is: check every bundled terminal task end to end in local Docker
# (oracle reward 1, untouched environment 0), then Recovery SFT of the tiny model on the
# bundled demo data (CPU, a few minutes), ending in an HF export under the workdir.
# When ReTerm-GRPO lands this becomes:
#   python -m reterm_jax.train --config=configs/grpo.py
set -euo pipefail
cd "$(dirname "$0")/.."

bash launch/setup.sh
python3 -m reterm_jax.sandbox check tasks/*/
python3 -m reterm_jax.train --config=configs/sft.py --workdir="${WORKDIR:-runs/quickstart-sft}" "$@"
