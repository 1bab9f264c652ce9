"""`reterm_jax.evaluate` with the model policy: attempts decoding one at a time (`slots=0`, the
lockstep engine behind a lock) vs sharing sampler rows (`slots=jobs`, a SlotEngine), side by side.

Generates `--tasks` held-out instances once, then runs the same evaluation command alternately
with slots=0 and slots=jobs (`--runs` each, interleaved), timing the whole command, and checks
that both score the same attempts (tokens, turns and end reason of every attempt).

    python bench/eval_slots.py [--tasks 8] [--jobs 4] [--runs 2] [--protocols pass@1,recovery@k] [--json]
Asserts nothing (benchmarks never gate tests).
"""
from __future__ import annotations

import argparse
import json
import os
import machine  # bench/machine.py
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def evaluate(tasks_dir: str, out: str, args, slots: int) -> float:
    cmd = [sys.executable, "-m", "reterm_jax.evaluate", "--config=configs/eval.py", f"--tasks={tasks_dir}",
           "--config.policy=model", f"--config.jobs={args.jobs}", f"--config.slots={slots}",
           f"--config.protocol.names={args.protocols}", f"--config.limits.max_turns={args.max_turns}",
           f"--config.limits.max_new_tokens_per_turn={args.turn_tokens}", f"--out={out}"]
    start = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=dict(os.environ, JAX_PLATFORMS="cpu"))
    return time.monotonic() - start


def attempts(path: str) -> list:
    res = json.loads(open(path).read())
    return [(t["task"], t["protocol"], t["sample"], [(a["tokens"], a["turns"], a["end_reason"]) for a in t["attempts"]])
            for t in res["trials"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--protocols", default="pass@1,recovery@k")
    ap.add_argument("--max_turns", type=int, default=4)
    ap.add_argument("--turn_tokens", type=int, default=96)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="eval-slots-")
    tasks_dir = os.path.join(work, "tasks")
    subprocess.run([sys.executable, "-m", "reterm_jax.tasks", "generate", "--split=heldout", f"--count={args.tasks}",
                    "--seed=7", f"--out={tasks_dir}"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    walls: dict[int, list[float]] = {0: [], args.jobs: []}
    same = True
    for i in range(args.runs):
        outs = {}
        for slots in (0, args.jobs):
            outs[slots] = os.path.join(work, f"r{i}-s{slots}.json")
            walls[slots].append(evaluate(tasks_dir, outs[slots], args, slots))
            if not args.json:
                print(f"run {i} slots={slots}: {walls[slots][-1]:.1f} s", flush=True)
        same &= attempts(outs[0]) == attempts(outs[args.jobs])
    n_trials = len(attempts(outs[0]))
    med = {s: statistics.median(w) for s, w in walls.items()}
    out = {"machine": machine.describe(),
           "date": time.strftime("%Y-%m-%d"), "tasks": args.tasks, "trials": n_trials, "jobs": args.jobs,
           "protocols": args.protocols, "runs": args.runs, "one_at_a_time_s": med[0], "slots_s": med[args.jobs],
           "speedup": med[0] / med[args.jobs], "same_attempts": bool(same), "walls": walls}
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
