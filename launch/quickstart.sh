#!/usr/bin/env bash
# Set up the machine and run the main job on its embedded default, on generated tasks.
#
#  1. generate 16 train-split and 8 held-out task instances (reterm_jax.tasks; their values come
#     from disjoint pools, so a memorised command cannot pass a held-out one) and check them in
#     local Docker (oracle 1, untouched 0, fault 0, fault then oracle 1);
#  2. teacher recovery demonstrations of the train instances (ReTerm-10K rows);
#  3. the main job, ReTerm-GRPO of the tiny model:
#       python -m reterm_jax.train --config=configs/grpo.py --config.env.tasks=W/tasks/train/* ...
#     which warm-starts from Recovery SFT on those rows (into W/sft), seeds the failure bank from
#     the train instances' scripted faults, trains on verified recovery groups branched from it,
#     ends with the reward trend (first vs last step that updated; steps updated and skipped)
#     and an HF export in W/hf;
#  4. a short held-out evaluation: Recovery@2 of the warm start (W/sft/hf) and of the GRPO
#     result (W/hf) on the 8 held-out instances, same sampling keys, and their paired difference.
# CPU only; ~16 minutes on 2 cores once set up (+~6 for a new machine). W = $WORKDIR (default runs/quickstart). Extra arguments go
# to the train command, e.g. `bash launch/quickstart.sh --config.train.steps=10`.
# A real learning measurement (64 held-out tasks, a compute-matched control, intervals) is
# experiments/learning/learning_run.py (docs/learning.md).
set -euo pipefail
cd "$(dirname "$0")/.."
W="${WORKDIR:-runs/quickstart}"

bash launch/setup.sh
echo "== generating tasks into $W/tasks (16 train, 8 held-out) and checking them in Docker"
python3 -m reterm_jax.tasks generate --split=train --count=16 --seed=0 --out="$W/tasks/train" --overwrite
python3 -m reterm_jax.tasks generate --split=heldout --count=8 --seed=0 --out="$W/tasks/heldout" --overwrite
python3 -m reterm_jax.sandbox check "$W"/tasks/train/* "$W"/tasks/heldout/*
echo "== teacher recovery demonstrations of the train instances"
[ -s "$W/demos.jsonl" ] || python3 -m reterm_jax.tasks demos "$W"/tasks/train/* --out="$W/demos.jsonl"
echo "== ReTerm-GRPO of the tiny model (SFT warm start on the demonstrations, then the failure bank, then GRPO)"
python3 -m reterm_jax.train --config=configs/grpo.py --workdir="$W/grpo" --config.env.tasks="$W/tasks/train/*" \
  --config.init.sft_data="$W/demos.jsonl" --config.init.sft_seq_len=2304 "$@"
echo "== held-out Recovery@2: the SFT warm start, then the GRPO result against it"
EVAL=(--config=configs/eval.py --tasks="$W/tasks/heldout" --config.policy=model --config.protocol.names=recovery@k)
python3 -m reterm_jax.evaluate "${EVAL[@]}" --config.model.hf_path="$W/grpo/sft/hf" --out="$W/eval_warm_start.json"
python3 -m reterm_jax.evaluate "${EVAL[@]}" --config.model.hf_path="$W/grpo/hf" --out="$W/eval_grpo.json" \
  --baseline="$W/eval_warm_start.json"
