"""GRPO rollouts per second, old vs new: the producer of `rl/grpo/loop.py` (`RecoveryProducer.produce`:
branch G sandboxes from a banked failure state, run the G recovery attempts, verify each, close)
under several rollout settings, or code versions, on the same failure states, keys and policy, in
one run.

    --setups lockstep:clone,continuous:in_place:prefetch
                                                  this checkout under `rollout.engine:rollout.verify`
                                                  settings, `:prefetch` = `rollout.prefetch_branches`
                                                  (default: the old settings, then the new ones)
    --old CHECKOUT                                also the producer of another checkout (e.g. a
                                                  `git worktree` of the commit before issue 12), as
                                                  it was: no engine, verify or prefetch setting

Each setup runs in a worker process of its own (its own failure bank, seeded once from the
bundled tasks' scripted faults, `bank.failures_from=fault_commands`, as the tiny preset does), after
one warm-up block (compilation, image builds). Every setup draws the same failure states in the
same order (group j recovers from state j mod 4, with key j) and runs them in blocks of `--block`
groups back to back, as a rollout worker does; blocks alternate workers, `--runs` each. A block's
time ends when its last group is returned and the branches its producer started ahead for the next
group (with prefetch) are running: the steady-state cost, nothing done in another setup's time.
Trajectories per second = block groups x G / block time; medians over blocks.

Policies: `sampled` (default: the random tiny model at temperature 1, as the tiny GRPO run
without a warm start: its attempts mostly end at the first malformed turn) or `scripted` (1-4 real
commands an attempt, then an answer: bench/scripted_turns.py).

    python bench/grpo_producer.py [--old CHECKOUT] [--group_size 4] [--block 4] [--runs 5] [--policy sampled] [--json]
Asserts nothing (benchmarks never gate tests).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import machine  # bench/machine.py
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
TASKS = ["daily-report-append", "ini-config-retarget", "git-stash-hotfix", "crlf-normalize-repo"]  # with faults


class _Pinned:
    """The bank, except that next() follows the bench's schedule (every setup draws the same states
    in the same order) and record() leaves the order alone."""

    def __init__(self, bank, entries):
        self.bank, self.entries, self.drawn = bank, entries, 0

    def next(self):
        entry = self.entries[self.drawn % len(self.entries)]
        self.drawn += 1
        return entry

    def record(self, *args, **kw):
        return False

    def __getattr__(self, name):
        return getattr(self.bank, name)

    def __len__(self):
        return len(self.bank)


def serve(args) -> int:
    """A worker: this setup's producer over `args.root`'s code; one JSON line per block asked on stdin."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path[:0] = [args.root, os.path.join(args.root, "tests"), HERE]
    import jax

    from reterm_jax.data import load_tokenizer
    from reterm_jax.rl.grpo.failure_bank import FailureBank
    from reterm_jax.rl.agent.harness import Limits
    from reterm_jax.rl.grpo.recovery import RecoveryConfig, RecoveryProducer
    from reterm_jax.sandbox import load_task
    from reterm_jax.sandbox.pool import SandboxPool
    from rl_test_utils import tiny_sampler
    from scripted_turns import scripted_turns
    import reterm_jax
    print(f"worker {args.setup}: reterm_jax from {os.path.dirname(reterm_jax.__file__)}", file=sys.stderr)

    tok = load_tokenizer()
    sampler = tiny_sampler(tok, max_length=4096)
    tasks = [load_task(os.path.join(ROOT, "tasks", name)) for name in TASKS]
    script = (lambda r, traj: scripted_turns(r)[len(traj.turns)]) if args.policy == "scripted" else None
    limits = Limits.tiny(max_new_tokens_per_turn=args.turn_tokens, max_turns=6, max_tokens=4096)
    settings = dict(group_size=args.group_size, limits=limits, failures_from="fault_commands", min_failures=1)
    if args.setup != "old":
        engine, verify, *rest = args.setup.split(":")
        settings.update(engine=engine, verify=verify, prefetch=rest == ["prefetch"])
    fields = {f.name for f in dataclasses.fields(RecoveryConfig)}
    if not set(settings) <= fields:
        raise SystemExit(f"{args.root}: RecoveryConfig has no {sorted(set(settings) - fields)}")
    with tempfile.TemporaryDirectory() as tmp, SandboxPool(max_concurrency=2 * args.group_size) as pool:
        bank = FailureBank(os.path.join(tmp, "bank"))
        producer = RecoveryProducer(bank, tasks, sampler, tok, RecoveryConfig(**settings), pool=pool, script=script)
        try:
            producer.seed_from_faults()
            entries = sorted((bank.get(e) for e in bank.entry_ids()), key=lambda e: e.task_name)
            if not entries:
                raise SystemExit("no failure state was banked from the tasks' scripted faults")
            producer.bank = pinned = _Pinned(bank, entries)
            for line in itertools.chain(["0"], iter(sys.stdin.readline, "")):  # block 0: the warm-up
                block, groups = int(line), []
                start = time.monotonic()
                for _ in range(args.block):
                    j = pinned.drawn  # the group's state and key: the same in every setup
                    group = producer.produce(1, None, jax.random.key(j))
                    if group is None:
                        raise SystemExit(f"{args.setup}: no group from {entries[j % len(entries)].task_name}")
                    groups.append(group)
                if hasattr(producer, "wait_prefetch"):  # the next group's branches, started in this block
                    producer.wait_prefetch()
                wall = time.monotonic() - start
                timing = {}
                for g in groups:
                    for k, v in (g.trajectories[0].timing or {}).items():
                        if isinstance(v, float):
                            timing[k] = timing.get(k, 0.0) + v / len(groups)
                print(json.dumps({"block": block, "wall_s": wall, "group_s": wall / len(groups),
                                  "trajectories_per_s": args.group_size * len(groups) / wall,
                                  "valid": sum(sum(g.valid) for g in groups), "members": args.group_size * len(groups),
                                  "turns": sum(len(t.turns) for g in groups for t in g.trajectories),
                                  "timing": {k: round(v, 3) for k, v in timing.items()}}), flush=True)
        finally:
            if hasattr(producer, "close"):
                producer.close()
            bank.destroy()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setups", default="lockstep:clone,continuous:in_place:prefetch",
                    help="comma-separated ENGINE:VERIFY[:prefetch] settings of this checkout")
    ap.add_argument("--old", default="", help="another checkout whose producer runs as it was (setup 'old')")
    ap.add_argument("--group_size", type=int, default=4)
    ap.add_argument("--block", type=int, default=4, help="groups a setup runs back to back per measured block")
    ap.add_argument("--runs", type=int, default=5, help="measured blocks per setup (after one warm-up block each)")
    ap.add_argument("--policy", choices=("sampled", "scripted"), default="sampled")
    ap.add_argument("--turn_tokens", type=int, default=160, help="max new tokens per turn")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # a worker (internal)
    ap.add_argument("--setup", default="", help=argparse.SUPPRESS)
    ap.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args)
    sys.path.insert(0, ROOT)
    from reterm_jax.rl.agent.rollout import ENGINES, VERIFY_MODES
    setups = {}
    if args.old:
        if not os.path.isdir(os.path.join(args.old, "reterm_jax")):
            raise SystemExit(f"--old {args.old!r}: not a reterm_jax checkout (no reterm_jax/ in it)")
        setups["old"] = os.path.abspath(args.old)
    for item in filter(None, args.setups.split(",")):
        engine, verify, *rest = item.split(":") + [""] * (item.count(":") < 1)
        if engine not in ENGINES or verify not in VERIFY_MODES or rest not in ([], ["prefetch"]):
            raise SystemExit(f"--setups {item!r}: use ENGINE:VERIFY[:prefetch] with ENGINE in {ENGINES}, "
                             f"VERIFY in {VERIFY_MODES}")
        setups[item] = os.path.abspath(ROOT)
    common = ["--group_size", str(args.group_size), "--block", str(args.block), "--policy", args.policy,
              "--turn_tokens", str(args.turn_tokens)]
    workers = {name: subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", "--setup", name,
                                       "--root", root] + common, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, bufsize=1)
               for name, root in setups.items()}
    results: dict[str, list[dict]] = {name: [] for name in setups}
    try:
        for name, w in workers.items():  # warm-ups (the workers seed and compile side by side)
            first = w.stdout.readline()
            if not first:
                raise SystemExit(f"worker {name} ended before its warm-up block (its stderr says why)")
            if not args.json:
                r = json.loads(first)
                print(f"warm-up {name:22s} {r['wall_s']:.2f} s", flush=True)
        for i in range(1, args.runs + 1):
            for name, w in workers.items():
                w.stdin.write(f"{i}\n")
                line = w.stdout.readline()
                if not line:
                    raise SystemExit(f"worker {name} ended at block {i} (its stderr says why)")
                r = json.loads(line)
                results[name].append(r)
                if not args.json:
                    print(f"block {i} {name:32s} {r['wall_s']:.2f} s ({r['group_s']:.2f} s a group), "
                          f"{r['trajectories_per_s']:.3f} trajectories/s, {r['turns']} turns, "
                          f"valid {r['valid']}/{r['members']}", flush=True)
    finally:
        for w in workers.values():
            w.stdin.close()
        for w in workers.values():
            w.wait()
    med = {name: statistics.median(r["trajectories_per_s"] for r in rs) for name, rs in results.items()}
    first = next(iter(med))
    out = {"machine": machine.describe(),
           "date": time.strftime("%Y-%m-%d"), "policy": args.policy, "group_size": args.group_size,
           "block": args.block,
           "runs": args.runs, "old": args.old, "trajectories_per_s": med,
           "ratio_to_first": {k: v / med[first] for k, v in med.items()}, "blocks": results}
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps({k: v for k, v in out.items() if k != "blocks"}, indent=1))
        for name, rs in results.items():  # the engines' own split of a group's wall (medians of block means)
            keys = sorted({k for r in rs for k in r["timing"]})
            print(name, {k: round(statistics.median(r["timing"].get(k, 0.0) for r in rs), 2) for k in keys})
    return 0


if __name__ == "__main__":
    sys.exit(main())
