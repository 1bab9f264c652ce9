"""Score policies on another split of a learning run's tasks the way its held-out evaluation
scores them: did GRPO learn on its own training instances, even where held-out did not move?
(experiments/learning/notebook.md run 39). Same protocols, sampling (the run's --eval_sampling), limits, --sets
and per-trial keys as the held-out evaluation; every policy after the first is compared with the
first by the paired difference and its bootstrap 95% interval. Needs Docker.

    python experiments/learning/split_eval.py --out OUT --hf OUT/warm_start_hf --hf OUT/grpo_hf --split grpo \
        --stride 2 --samples 2 [--protocols shared] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "configs")]  # runnable from a checkout

from learning_data import log, task_dirs  # noqa: E402  (experiments/learning/)
from learning_eval import FAULT_RECOVERY, evaluate, model_policy, parse_protocols, parse_sampling, run_config, run_state  # noqa: E402  (experiments/learning/)
from reterm_jax.rl.evaluation.protocols import paired_difference  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="a experiments/learning/learning_run.py output directory (its state.json and tasks/)")
    p.add_argument("--hf", action="append", required=True,
                   help="an HF policy dir (repeatable); the first is the baseline of the paired differences")
    p.add_argument("--split", default="grpo", help="a folder under OUT/tasks: grpo, train, val, words, novel, heldout")
    p.add_argument("--stride", type=int, default=1, help="every Nth instance of the split (sorted)")
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--protocols", default="shared", help=f"comma-separated: shared (pass@1, retry@2, recovery@2), "
                                                         f"{FAULT_RECOVERY}")
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--json", default="", help="also write the summaries and differences here")
    args = p.parse_args()
    state = run_state(args.out, args.hf)
    try:
        protocols = parse_protocols(args.protocols)
    except ValueError as e:
        sys.exit(str(e))
    if args.stride < 1 or args.samples < 1:
        sys.exit(f"--stride={args.stride} --samples={args.samples}: both must be at least 1")
    dirs = task_dirs(Path(args.out), args.split)[::args.stride]
    if not dirs:
        sys.exit(f"--split={args.split}: OUT/tasks/{args.split} holds no task dirs")
    gcfg = run_config(state)
    eval_sampling = state["config"]["args"].get("eval_sampling") or "rollout"
    sampling = parse_sampling(eval_sampling)
    summaries = {}
    for hf in args.hf:
        t0 = time.time()
        summary, _ = evaluate(model_policy(gcfg, hf, sampling=sampling), dirs, samples=args.samples,
                              jobs=args.jobs, protocols=protocols)
        summaries[hf] = summary
        log(f"{hf}: {len(dirs)} {args.split} instances x {args.samples}: "
            + ", ".join(f"{k} {v['score']:.3f}" for k, v in summary.items()) + f" ({time.time() - t0:.0f} s)")
    base = args.hf[0]
    diffs = {hf: {k: paired_difference(summaries[hf][k]["per_task"], summaries[base][k]["per_task"])
                  for k in summaries[base]} for hf in args.hf[1:]}
    for hf, by_metric in diffs.items():
        for k, d in by_metric.items():
            log(f"{hf} - {base}: {k} {d['mean'] * 100:+.1f} [{d['ci95'][0] * 100:+.1f}, {d['ci95'][1] * 100:+.1f}] "
                f"({d['improved']} better / {d['worse']} worse)")
    if args.json:
        json.dump({"out": args.out, "split": args.split, "stride": args.stride, "samples": args.samples,
                   "eval_sampling": eval_sampling, "tasks": len(dirs), "summaries": summaries, "differences": diffs},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
