"""Does GRPO help? Verified pass rate: the SFT warm start vs after N GRPO steps, paired over tasks.

    python experiments/learning/learning_demo.py [--steps 20] [--tasks 'tasks/*'] [--eval_tasks GLOB] [--max_tasks 0] [--samples 2]
                                  [--protocols pass@1,fault-recovery] [--set stream.max_pulls_per_step=4 ...] [--workdir runs/learning-demo]

1. the warm start: <workdir>/sft (configs/sft.py:tiny, run if missing) or --init=<ckpt dir>;
2. evaluate it (rl.evaluation protocols, a ModelPolicy at the GRPO sampling settings and limits);
3. `reterm_jax.rl.grpo.loop.train` for --steps steps (configs/grpo.py:tiny) into <workdir>/grpo
   (resumes if already there);
4. evaluate the GRPO params the same way; print both as one table with the paired difference per
   protocol (mean over tasks of after - before, 95% bootstrap interval over tasks:
   rl/evaluation/protocols.py::paired_difference) and write <workdir>/learning_demo.json.
--eval_tasks scores other tasks than GRPO trains on, e.g. generated held-out instances
(`python -m reterm_jax.tasks generate --split=heldout ...`, docs/tasks.md) while --tasks has the
train split. Needs Docker. Asserts nothing (benchmarks never gate tests).
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

from absl import logging  # noqa: E402

import grpo as grpo_config  # noqa: E402  (configs/grpo.py)
from reterm_jax.rl.evaluation import protocols as evaluation  # noqa: E402
from reterm_jax.rl.evaluation.policies import fault_then  # noqa: E402
from reterm_jax.rl.grpo import loop as grpo  # noqa: E402
from reterm_jax.rl.grpo.init import warm_start_sft  # noqa: E402
from learning_eval import FAULT_RECOVERY, apply_sets, model_policy  # noqa: E402  (experiments/learning/)


# FAULT_RECOVERY: recovery from each task's scripted fault (what the tiny preset's failure bank
# holds): attempt 1 runs the fault commands, attempt 2 is the model's, continuing the failed history.


def _policy(gcfg, checkpoint: str):
    """The model at `checkpoint` through the bash harness, sampled as GRPO samples (temperature,
    no top-k/p) under the GRPO rollout limits (reterm_jax.evaluate's model policy, built here:
    that module's absl flags clash with reterm_jax.convert's in one process)."""
    from reterm_jax.convert import restore_model
    return model_policy(gcfg, model=restore_model(checkpoint), seed=gcfg.seed)


def _evaluate(gcfg, checkpoint: str, dirs: list[Path], args) -> dict:
    """evaluation.summarize over every (task, protocol, sample) trial, run on a SandboxPool."""
    from reterm_jax.sandbox import DockerSandbox, SandboxPool, load_task, verify
    policy = _policy(gcfg, checkpoint)
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    jobs = [(d, p, s) for d in dirs for p in protocols for s in range(args.samples)]

    def run(job):
        d, protocol, sample = job
        if protocol == FAULT_RECOVERY:  # attempt 1 = the scripted fault, attempt 2 = the model
            return evaluation.recovery_at_k(fault_then(policy), load_task(d), k=2, sample=sample,
                                            sandbox_factory=DockerSandbox.from_task, verify_fn=verify)
        return evaluation.run_trial(policy, d, protocol, k=args.k, sample=sample,
                                    sandbox_factory=DockerSandbox.from_task, verify_fn=verify, load_task_fn=load_task)

    if FAULT_RECOVERY in protocols:  # only tasks that have a scripted fault
        jobs = [j for j in jobs if j[1] != FAULT_RECOVERY or load_task(j[0]).fault_commands]
    with SandboxPool(max_concurrency=args.jobs) as pool:
        outcomes = [f.result() for f in [pool.submit(run, job) for job in jobs]]
    trials = [o.value if o.ok else evaluation.Trial(d.name, p, s, error=o.error)
              for (d, p, s), o in zip(jobs, outcomes)]
    out = evaluation.summarize([t for (_, p, _), t in zip(jobs, trials) if p != FAULT_RECOVERY], args.k)
    fault = [t for (_, p, _), t in zip(jobs, trials) if p == FAULT_RECOVERY]
    if fault:
        out[FAULT_RECOVERY] = evaluation.fault_recovery_summary(fault)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="GRPO steps")
    p.add_argument("--tasks", default="tasks/*", help="glob of task dirs (training and evaluation)")
    p.add_argument("--eval_tasks", default="", help="glob of the tasks to evaluate on (default: --tasks), "
                   "e.g. generated held-out instances")
    p.add_argument("--max_tasks", type=int, default=0, help="use the first N tasks (0 = all)")
    p.add_argument("--samples", type=int, default=2, help="evaluation samples per task and protocol")
    p.add_argument("--protocols", default=f"pass@1,{FAULT_RECOVERY}",
                   help=f"comma-separated: pass@1, retry@k, recovery@k (model only), {FAULT_RECOVERY}")
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--jobs", type=int, default=2, help="evaluation trials at once")
    p.add_argument("--init", default="", help="warm start checkpoint (default: <workdir>/sft, run if missing)")
    p.add_argument("--workdir", default="runs/learning-demo")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configs/grpo.py:tiny field, e.g. --set stream.max_pulls_per_step=4 "
                        "--set optim.lr=2e-4 (repeatable)")
    args = p.parse_args()
    logging.set_verbosity(logging.WARNING)
    workdir = os.path.abspath(args.workdir)

    gcfg = grpo_config.get_config("tiny")
    gcfg.env.tasks, gcfg.env.max_tasks = args.tasks, args.max_tasks
    gcfg.train.steps = args.steps
    apply_sets(gcfg, args.set)
    if not [d for d in glob.glob(args.tasks) if os.path.isdir(d)]:
        sys.exit(f"--tasks={args.tasks!r} matches no directories")
    dirs = [Path(d) for d in sorted(glob.glob(args.eval_tasks or args.tasks)) if os.path.isdir(d)]
    if args.max_tasks:
        dirs = dirs[:args.max_tasks]
    if not dirs:
        sys.exit(f"--eval_tasks={args.eval_tasks!r} matches no directories")

    t0 = time.time()
    init = args.init or warm_start_sft(gcfg, workdir)  # <workdir>/sft/checkpoints
    gcfg.init.checkpoint = init
    print(f"warm start: {init} ({time.time() - t0:.0f}s)", flush=True)

    t0 = time.time()
    before = _evaluate(gcfg, init, dirs, args)
    print(f"evaluated the warm start on {len(dirs)} tasks ({time.time() - t0:.0f}s)", flush=True)

    t0 = time.time()
    result = grpo.train(gcfg, os.path.join(workdir, "grpo"))
    rewards = result["rewards"]
    print(f"GRPO: {args.steps} steps ({time.time() - t0:.0f}s); rollout reward mean "
          + (f"{rewards[min(rewards)]:.3f} (step {min(rewards)}) -> {rewards[max(rewards)]:.3f} (step {max(rewards)})"
             if rewards else "n/a (already trained)"), flush=True)

    t0 = time.time()
    after = _evaluate(gcfg, os.path.join(workdir, "grpo", "checkpoints"), dirs, args)
    print(f"evaluated the GRPO params ({time.time() - t0:.0f}s)\n", flush=True)

    header = (f"{'protocol':<16}{'SFT warm start':>16}{f'GRPO {args.steps} steps':>18}{'gain [95% CI]':>24}"
              f"{'tasks':>7}{'trials':>8}")
    print(header)
    print("-" * len(header))
    gains = {}
    for label in before:
        b, a = before[label], after.get(label, {})
        if a.get("per_task") and set(a["per_task"]) == set(b["per_task"]):
            gains[label] = evaluation.paired_difference(a["per_task"], b["per_task"])
        g = gains.get(label)
        cell = f"{g['mean']:+.3f} [{g['ci95'][0]:+.2f}, {g['ci95'][1]:+.2f}]" if g else "n/a"
        print(f"{label:<16}{b['score']:>16.3f}{a.get('score', float('nan')):>18.3f}{cell:>24}"
              f"{b['tasks']:>7}{b['trials']:>8}")
    out = os.path.join(workdir, "learning_demo.json")
    with open(out, "w") as fh:
        json.dump({"train_tasks": args.tasks, "tasks": [str(d) for d in dirs], "steps": args.steps,
                   "samples": args.samples, "before": before, "after": after, "gain": gains,
                   "rollout_rewards": rewards}, fh, indent=1)
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
