#!/usr/bin/env bash
# Set up the machine and run the main job on its embedded default.
#
# Today the main job checks the bundled terminal tasks end to end in local Docker
# (every oracle solution earns reward 1, every untouched environment reward 0).
# When GRPO lands (issue 6) this becomes:
#   python -m reterm_jax.train --config=configs/grpo.py
set -euo pipefail
cd "$(dirname "$0")/.."

bash launch/setup.sh
python3 -m reterm_jax.sandbox check tasks/*/
