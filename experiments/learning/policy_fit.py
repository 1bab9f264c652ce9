"""Train fit and validation of exported policies, scored as experiments/learning/learning_run.py scores its SFT
candidates: recovery from the scripted fault, 1 sample per task, on the run's validation slice and
on as many evenly spaced train instances (learning_data.fit_slice), under the run's rollout limits
and --set overrides, with the same per-trial keys. Any policy can be scored this way, not only the
run's SFT candidates: e.g. a GRPO policy, or the policy an SFT started from (experiments/learning/notebook.md, run 37).

    python experiments/learning/policy_fit.py --out OUT --hf HF_DIR [--hf HF_DIR ...] [--jobs 3] [--json FILE]

OUT is a learning run's output directory (its tasks/train, tasks/val and state.json); scoring the
policy a run chose as its warm start gives the run's own scores back. Needs Docker.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "configs")]  # runnable from a checkout

from learning_data import fit_slice, log, task_dirs  # noqa: E402  (experiments/learning/)
from learning_eval import FAULT_RECOVERY, evaluate, model_policy, run_config, run_state  # noqa: E402  (experiments/learning/)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="a learning run's output directory (tasks/ and state.json)")
    p.add_argument("--hf", action="append", required=True, metavar="HF_DIR", help="a policy to score (repeatable)")
    p.add_argument("--jobs", type=int, default=3, help="trials at once")
    p.add_argument("--json", default="", help="also write the scores here")
    args = p.parse_args()
    out = Path(args.out)
    state = run_state(args.out, args.hf)
    train, val = task_dirs(out, "train"), task_dirs(out, "val")
    if not train or not val:
        sys.exit(f"--out={args.out}: tasks/train or tasks/val is empty; the run has not generated its tasks yet")
    gcfg = run_config(state)
    slices = {"train_fit": fit_slice(train, val), "validation": val}
    scores = {}
    for hf in args.hf:
        policy = model_policy(gcfg, hf)
        scores[hf] = {}
        for name, tasks in slices.items():
            summary, _ = evaluate(policy, tasks, samples=1, jobs=args.jobs, protocols=(FAULT_RECOVERY,))
            score = summary[FAULT_RECOVERY]["score"]
            scores[hf][name] = {"tasks": len(tasks), "fault-recovery": score}
            log(f"{hf}: {name.replace('_', ' ')} ({len(tasks)} tasks): fault-recovery {score:.3f} "
                f"({round(score * len(tasks))}/{len(tasks)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"out": str(out), "scores": scores}, f, indent=1)


if __name__ == "__main__":
    main()
