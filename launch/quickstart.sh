#!/usr/bin/env bash
# Set up the machine and run the main job on its embedded default.
#
# The main job, on its embedded default: check every bundled terminal task end to end in
# local Docker (oracle reward 1, untouched environment 0), then ReTerm-GRPO of the tiny model:
#   python -m reterm_jax.train --config=configs/grpo.py
# which warm-starts from Recovery SFT on the bundled demo data (run first, into
# <workdir>/sft), seeds the failure bank, trains on verified recovery groups branched from
# it in Docker, and ends in an HF export under <workdir>/hf. CPU only; ~15-25 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

bash launch/setup.sh
echo "== checking the bundled tasks in Docker (oracle reward 1, untouched environment 0)"
python3 -m reterm_jax.sandbox check tasks/*/
echo "== ReTerm-GRPO of the tiny model (SFT warm start first, then the failure bank, then GRPO steps)"
python3 -m reterm_jax.train --config=configs/grpo.py --workdir="${WORKDIR:-runs/quickstart-grpo}" "$@"
