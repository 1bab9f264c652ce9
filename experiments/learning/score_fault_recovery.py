"""Fault-recovery of one HF policy on task dirs, several samples a task, under a learning run's
rollout limits: how often a warm start recovers, and so whether GRPO's groups of G attempts would
hold both a pass and a fail (experiments/learning/notebook.md run 13). Needs Docker.

    python experiments/learning/score_fault_recovery.py --hf experiments/learning/results/run13_warm_start_hf \
        --state OUT/state.json --tasks 'OUT/tasks/val/*' --samples 4
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "configs")]  # runnable from a checkout

from learning_eval import FAULT_RECOVERY, evaluate, model_policy, run_config  # noqa: E402  (experiments/learning/)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hf", required=True, help="an HF dir (e.g. a learning run's OUT/warm_start_hf)")
    p.add_argument("--state", required=True, help="the learning run's OUT/state.json (its rollout limits)")
    p.add_argument("--tasks", required=True, help="a glob of task dirs")
    p.add_argument("--max_tasks", type=int, default=0, help="the first N task dirs (0: all)")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--jobs", type=int, default=3)
    args = p.parse_args()
    dirs = sorted(Path(d) for d in glob.glob(args.tasks) if os.path.isdir(d))[:args.max_tasks or None]
    if not dirs:
        sys.exit(f"--tasks {args.tasks!r}: no task dirs match; give a glob like 'OUT/tasks/val/*'")
    gcfg = run_config(json.load(open(args.state)))
    t0 = time.time()
    summary, _ = evaluate(model_policy(gcfg, args.hf), dirs, samples=args.samples, jobs=args.jobs,
                          protocols=(FAULT_RECOVERY,))
    per_task = summary[FAULT_RECOVERY]["per_task"]
    mixed = sum(0 < v < 1 for v in per_task.values())
    print(json.dumps({"tasks": len(dirs), "samples": args.samples, "score": summary[FAULT_RECOVERY]["score"],
                      "tasks_with_a_pass": sum(v > 0 for v in per_task.values()), "tasks_mixed": mixed,
                      "per_task": per_task, "wall_s": round(time.time() - t0)}))


if __name__ == "__main__":
    main()
