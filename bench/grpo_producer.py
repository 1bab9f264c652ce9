"""GRPO rollouts per second, old vs new: the producer of `train/grpo.py` (`RecoveryProducer.produce`:
branch G sandboxes from a banked failure state, run the G recovery attempts, verify each, close)
under two rollout settings, on the same failure states, keys and policy, one run.

    old  rollout.engine=lockstep,   rollout.verify=clone     (the settings before issue 12)
    new  rollout.engine=continuous, rollout.verify=in_place

(`--setups` takes any list of ENGINE:VERIFY; ratios are against the first.) The failure bank is
seeded once from the bundled tasks' scripted faults (`bank.failures_from=fault_commands`, as the
tiny preset does); round i of every setup recovers from the same entry with the same key. Rounds
alternate setups, `--runs` each after one warm-up round each (compilation, image builds).
Trajectories per second = G / the wall time of `produce()` (branching and closing included).

Policies: `sampled` (default: the random tiny model at temperature 1, as the tiny GRPO run
without a warm start: its attempts mostly end at the first malformed turn) or `scripted` (1-4 real
commands an attempt, then an answer: bench/rollout_engines.py's turns).

    python bench/grpo_producer.py [--group_size 4] [--runs 3] [--policy sampled] [--json]
Asserts nothing (benchmarks never gate tests).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]

import jax  # noqa: E402

from reterm_jax.data import load_tokenizer  # noqa: E402
from reterm_jax.rl.failure_bank import FailureBank  # noqa: E402
from reterm_jax.rl.harness import Limits  # noqa: E402
from reterm_jax.rl.recovery import RecoveryConfig, RecoveryProducer  # noqa: E402
from reterm_jax.rl.rollout import ENGINES, VERIFY_MODES  # noqa: E402
from reterm_jax.sandbox import load_task  # noqa: E402
from reterm_jax.sandbox.pool import SandboxPool  # noqa: E402
from rl_test_utils import tiny_sampler  # noqa: E402
from rollout_engines import scripted_turns  # noqa: E402

TASKS = ["daily-report-append", "ini-config-retarget", "git-stash-hotfix", "crlf-normalize-repo"]  # with fault_commands


class _Pinned:
    """The bank, except that next() gives the entry the round chose (every setup sees the same)."""

    def __init__(self, bank):
        self.bank, self.entry = bank, None

    def next(self):
        return self.entry

    def record(self, *args, **kw):  # leave the bank's order alone: the rounds choose the entries
        return False

    def __getattr__(self, name):
        return getattr(self.bank, name)

    def __len__(self):
        return len(self.bank)


def parse_setups(text: str) -> list[tuple[str, str]]:
    setups = []
    for item in text.split(","):
        engine, _, verify = item.partition(":")
        if engine not in ENGINES or verify not in VERIFY_MODES:
            raise SystemExit(f"--setups {item!r}: use ENGINE:VERIFY with ENGINE in {ENGINES}, VERIFY in {VERIFY_MODES}")
        setups.append((engine, verify))
    return setups


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setups", default="lockstep:clone,continuous:in_place")
    ap.add_argument("--group_size", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="measured rounds per setup (after one warm-up each)")
    ap.add_argument("--policy", choices=("sampled", "scripted"), default="sampled")
    ap.add_argument("--turn_tokens", type=int, default=160, help="max new tokens per turn")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    setups = parse_setups(args.setups)
    tok = load_tokenizer()
    sampler = tiny_sampler(tok, max_length=4096)
    tasks = [load_task(os.path.join(ROOT, "tasks", name)) for name in TASKS]
    script = (lambda r, traj: scripted_turns(r)[len(traj.turns)]) if args.policy == "scripted" else None
    limits = Limits.tiny(max_new_tokens_per_turn=args.turn_tokens, max_turns=6, max_tokens=4096)
    results: dict[str, list[dict]] = {f"{e}:{v}": [] for e, v in setups}
    with tempfile.TemporaryDirectory() as tmp, SandboxPool(max_concurrency=2 * args.group_size) as pool:
        bank = FailureBank(os.path.join(tmp, "bank"))
        pinned = _Pinned(bank)
        producers = {}
        for engine, verify in setups:
            cfg = RecoveryConfig(group_size=args.group_size, limits=limits, failures_from="fault_commands",
                                 engine=engine, verify=verify, min_failures=1)
            producers[f"{engine}:{verify}"] = RecoveryProducer(pinned, tasks, sampler, tok, cfg, pool=pool, script=script)
        try:
            next(iter(producers.values())).seed_from_faults()
            entries = bank.entry_ids()
            if not entries:
                raise SystemExit("no failure state was banked from the tasks' scripted faults")
            for i in range(args.runs + 1):
                pinned.entry = bank.get(entries[i % len(entries)])
                for name, producer in producers.items():
                    start = time.monotonic()
                    group = producer.produce(1, None, jax.random.key(i))
                    wall = time.monotonic() - start
                    if group is None:
                        raise SystemExit(f"{name}: no group from {pinned.entry.entry_id}")
                    timing = group.trajectories[0].timing or {}
                    r = {"entry": pinned.entry.task_name, "wall_s": wall, "trajectories_per_s": args.group_size / wall,
                         "rewards": group.rewards, "valid": group.valid,
                         "turns": sum(len(t.turns) for t in group.trajectories),
                         "timing": {k: round(v, 3) for k, v in timing.items() if isinstance(v, float)}}
                    if i > 0:
                        results[name].append(r)
                    if not args.json:
                        print(f"round {i}{' (warm-up)' if i == 0 else ''} {name:22s} {r['entry']:22s} "
                              f"{wall:.2f} s, {r['trajectories_per_s']:.3f} trajectories/s, {r['turns']} turns, "
                              f"valid {sum(group.valid)}/{len(group.valid)}", flush=True)
        finally:
            bank.destroy()
    med = {name: statistics.median(r["trajectories_per_s"] for r in rs) for name, rs in results.items()}
    first = next(iter(med))
    out = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
           "date": time.strftime("%Y-%m-%d"), "policy": args.policy, "group_size": args.group_size,
           "runs": args.runs, "trajectories_per_s": med, "ratio_to_first": {k: v / med[first] for k, v in med.items()},
           "rounds": results}
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))
        for name, rs in results.items():  # the engines' own split of the group's wall (medians)
            keys = sorted({k for r in rs for k in r["timing"]})
            print(name, {k: round(statistics.median(r["timing"].get(k, 0.0) for r in rs), 2) for k in keys})
    return 0


if __name__ == "__main__":
    sys.exit(main())
