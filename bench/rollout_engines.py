"""Rollout engines side by side with real Docker: lockstep (rl/agent/rollout.py) vs continuous batching
over slots (rl/agent/continuous.py), trajectories per second on the same tasks, seeds and policy.

Each round starts `groups` x G sandboxes from the bundled tasks (G per task, as GRPO's groups),
then runs all of them through one engine, verification included, and times only the engine (the
sandboxes' start and removal are the same for both and left out):
  lockstep    one `run_episodes` call per group of G rows, as the GRPO producer does;
  continuous  one `run_continuous` call with `--slots` rows (default G) for all the groups' attempts.
Rounds alternate lockstep / continuous, `--runs` each; the first round of each is a warm-up
(compilation) and is not counted.

Policies: `scripted` (default) teacher-forces turns of varied lengths that run real commands in
the sandbox (1-4 commands an attempt, then a final answer), so both engines produce the same
trajectories and only the scheduling differs; `sampled` lets the random tiny model write
(temperature 1, decode-bound, its tool calls mostly malformed).

    python bench/rollout_engines.py [--groups 2] [--group_size 4] [--runs 3] [--policy scripted] [--json]
Asserts nothing (benchmarks never gate tests).
"""
from __future__ import annotations

import argparse
import json
import os
import machine  # bench/machine.py
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]  # from a checkout

import jax  # noqa: E402

from reterm_jax.data import load_tokenizer  # noqa: E402
from reterm_jax.rl.agent.continuous import run_continuous  # noqa: E402
from reterm_jax.rl.agent.harness import Limits, initial_messages  # noqa: E402
from reterm_jax.rl.agent.rollout import run_episodes  # noqa: E402
from reterm_jax.rl.inference.sampling import SamplingParams  # noqa: E402
from reterm_jax.sandbox import DockerSandbox, load_task, verify  # noqa: E402
from reterm_jax.sandbox.pool import SandboxPool  # noqa: E402
from reterm_jax.sandbox.snapshots import start_sandboxes  # noqa: E402
from rl_test_utils import tiny_sampler  # noqa: E402
from scripted_turns import scripted_turns  # noqa: E402

TASKS = ["daily-report-append", "csv-region-totals", "env-file-loader", "checksum-quarantine"]
def one_round(engine: str, tasks, sampler, tok, args, pool) -> dict:
    g, n = args.group_size, args.groups * args.group_size
    group_tasks = [tasks[i % len(tasks)] for i in range(args.groups)]
    episode_tasks = [t for t in group_tasks for _ in range(g)]
    sandboxes = []
    for t in group_tasks:
        sandboxes += start_sandboxes(lambda t=t: DockerSandbox.from_task(t), g)
    limits = Limits.tiny(max_new_tokens_per_turn=args.turn_tokens, max_turns=6)
    script = (lambda e, traj: scripted_turns(e)[len(traj.turns)]) if args.policy == "scripted" else None
    params = SamplingParams(1.0)
    try:
        start = time.monotonic()
        if engine == "lockstep":
            trajs = []
            for k in range(args.groups):
                rows = range(k * g, (k + 1) * g)
                offset = k * g  # the script is keyed by episode, as in the continuous run
                part = run_episodes(sampler, tok, [sandboxes[e] for e in rows],
                                    [initial_messages(episode_tasks[e].instruction) for e in rows],
                                    task_ids=[episode_tasks[e].name for e in rows], limits=limits, params=params,
                                    key=jax.random.key(k), pool=pool, verify_fn=verify,
                                    script=None if script is None else (lambda r, t, o=offset: script(o + r, t)))
                trajs += part
        else:
            trajs = run_continuous(sampler, tok, sandboxes, [initial_messages(t.instruction) for t in episode_tasks],
                                   task_ids=[t.name for t in episode_tasks], limits=limits, params=params,
                                   key=jax.random.key(0), pool=pool, verify_fn=verify, script=script, slots=args.slots or g,
                                   burst=args.burst)
        wall = time.monotonic() - start
    finally:
        for sb in sandboxes:
            sb.close()
    timing = {}
    for t in ({id(x.timing): x.timing for x in trajs}).values():
        for k, v in t.items():
            timing[k] = timing.get(k, 0) + v
    return {"wall_s": wall, "trajectories_per_s": n / wall, "turns": sum(len(t.turns) for t in trajs),
            "sampled_tokens": sum(t.num_sampled for t in trajs),
            "end_reasons": sorted({t.end_reason for t in trajs}), "timing": timing}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group_size", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="measured rounds per engine (after one warm-up each)")
    ap.add_argument("--policy", choices=("scripted", "sampled"), default="scripted")
    ap.add_argument("--turn_tokens", type=int, default=160, help="max new tokens per turn")
    ap.add_argument("--burst", type=int, default=32, help="continuous engine: decode steps per sampler call")
    ap.add_argument("--slots", type=int, default=0, help="continuous engine's rows (default: group_size)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tok = load_tokenizer()
    sampler = tiny_sampler(tok, max_length=4096)
    tasks = [load_task(os.path.join(ROOT, "tasks", name)) for name in TASKS]
    results: dict[str, list[dict]] = {"lockstep": [], "continuous": []}
    with SandboxPool(max_concurrency=2 * args.group_size) as pool:
        for i in range(args.runs + 1):
            for engine in ("lockstep", "continuous"):
                r = one_round(engine, tasks, sampler, tok, args, pool)
                if i > 0:
                    results[engine].append(r)
                if not args.json:
                    print(f"round {i}{' (warm-up)' if i == 0 else ''} {engine:10s} {r['wall_s']:.2f} s, "
                          f"{r['trajectories_per_s']:.3f} trajectories/s, {r['turns']} turns", flush=True)
    med = {e: statistics.median(r["trajectories_per_s"] for r in rs) for e, rs in results.items()}
    out = {"machine": machine.describe(),
           "date": time.strftime("%Y-%m-%d"), "policy": args.policy, "groups": args.groups,
           "group_size": args.group_size, "runs": args.runs, "burst": args.burst, "slots": args.slots or args.group_size,
           "lockstep_trajectories_per_s": med["lockstep"], "continuous_trajectories_per_s": med["continuous"],
           "ratio": med["continuous"] / med["lockstep"],
           "rounds": results}
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))
        for e, rs in results.items():
            keys = ("prefill_s", "decode_s", "observe_s", "sandbox_s", "verify_s")
            print(e, {k: round(statistics.median(r["timing"][k] for r in rs), 2) for k in keys},
                  "occupancy", round(statistics.median(r["timing"]["decode_tokens"] / max(1, r["timing"]["row_steps"])
                                                       for r in rs), 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
