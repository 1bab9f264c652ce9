"""Fill a failure bank with a policy's own failed first attempts, then (optionally) build the
teacher's recovery rows from it (reterm_jax/tasks/bank_demos.py).

    python experiments/learning/own_failures.py --hf experiments/learning/results/run16_warm_start_hf --tasks 'RUN/tasks/words/*' \
        --bank OUT/failure_bank --sampling 0.6,20,0.95 [--attempts N] [--batch 8] [--rows OUT/own_rows.jsonl] \
        [--skip_ends max_turns]

One fresh attempt per task (round robin over --tasks, --attempts in all; default one each), sampled
with --sampling under the rollout limits the HF dir's learning_run_state.json records (a learning
run's warm start), is verified on the image the bank keeps; each failure is banked as GRPO's
`bank.failures_from=policy` banks it (rl/grpo/recovery.py RecoveryProducer.collect). A bank that holds
entries already is added to. Training-split tasks only (the rows would train on them). Needs Docker;
asserts nothing.
"""
from __future__ import annotations

import argparse
import glob
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def rollout_limits(hf_dir: str):
    """The rollout limits and cache length of the learning run that made `hf_dir`."""
    from reterm_jax.rl.agent.harness import Limits
    path = Path(hf_dir) / "learning_run_state.json"
    if not path.is_file():
        sys.exit(f"--hf={hf_dir}: no learning_run_state.json there (a learning run's warm_start_hf has one): "
                 "its rollout limits are the ones its rows were made for")
    r = json.loads(path.read_text())["config"]["grpo"]["rollout"]
    limits = Limits(max_turns=r["max_turns"], max_tokens=r["max_tokens"],
                    max_new_tokens_per_turn=r["max_new_tokens_per_turn"], wall_clock_s=r["wall_clock_s"],
                    command_timeout_s=r["command_timeout_s"])
    return limits, int(r["cache_length"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf", required=True, help="the policy: an HF dir with learning_run_state.json")
    p.add_argument("--tasks", action="append", required=True, help="task dirs (a glob; repeatable)")
    p.add_argument("--bank", required=True, help="failure bank directory (created, or added to)")
    p.add_argument("--sampling", default="0.6,20,0.95", help="TEMPERATURE,TOP_K,TOP_P (or rollout: 1.0)")
    p.add_argument("--attempts", type=int, default=0, help="fresh attempts in all (0 = one per task)")
    p.add_argument("--batch", type=int, default=8, help="attempts run at once (one sampler slot each)")
    p.add_argument("--rows", default="", help="then write the bank's teacher recovery rows to this JSONL")
    p.add_argument("--jobs", type=int, default=3, help="entries at once for --rows")
    p.add_argument("--skip_ends", default="", metavar="REASON,...",
                   help="--rows leaves out entries whose attempt ended so, e.g. max_turns (run 19: those rows "
                        "taught long recoveries after long attempts)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")

    import jax

    from learning_eval import parse_sampling
    from reterm_jax.data import load_tokenizer, special_ids
    from reterm_jax.model.hf_io import load_pretrained
    from reterm_jax.rl.grpo.failure_bank import FailureBank
    from reterm_jax.rl.grpo.recovery import RecoveryConfig, RecoveryProducer
    from reterm_jax.rl.inference.sampler import Sampler
    from reterm_jax.rl.inference.sampling import SamplingParams
    from reterm_jax.sandbox import load_task
    from reterm_jax.tasks.demos import generator_meta
    from reterm_jax.tasks.pools import TRAINING_SPLITS

    from reterm_jax.tasks.bank_demos import parse_end_reasons
    try:
        skip_ends = parse_end_reasons(args.skip_ends)
    except ValueError as e:
        sys.exit(str(e))
    dirs = sorted({d for pattern in args.tasks for d in glob.glob(pattern) if os.path.isdir(d)})
    if not dirs:
        sys.exit(f"--tasks {args.tasks}: no task directories match")
    wrong = [d for d in dirs if generator_meta(d)["split"] not in TRAINING_SPLITS]
    if wrong:
        sys.exit(f"{len(wrong)} of the tasks are not from a training split (e.g. {wrong[0]}): bank training tasks only")
    try:
        sampling = parse_sampling(args.sampling) or SamplingParams(1.0)
    except ValueError as e:
        sys.exit(str(e))
    limits, cache_length = rollout_limits(args.hf)
    tasks = [load_task(d) for d in dirs]
    attempts = args.attempts or len(tasks)
    tok = load_tokenizer(args.hf)
    ids = special_ids(tok)
    sampler = Sampler(load_pretrained(args.hf), stop_ids=ids.stop, pad_id=ids.pad, max_length=cache_length)
    cfg = RecoveryConfig(limits=limits, sampling=sampling, collect_batch=args.batch, engine="continuous")
    start, key = time.monotonic(), jax.random.key(args.seed)
    with FailureBank(args.bank, max_entries=max(10**6, attempts), max_age_s=math.inf, seed=args.seed) as bank:
        before = len(bank)
        producer = RecoveryProducer(bank, tasks, sampler, tok, cfg)
        rounds = math.ceil(attempts / args.batch)
        for r in range(rounds):
            producer.collect(sampler, 0, jax.random.fold_in(key, r))
            s = producer.stats
            print(f"round {r + 1}/{rounds}: {s.fresh_attempts} attempts, {s.fresh_resolved} solved, "
                  f"{s.failures_added} banked, {s.sandbox_errors} errors ({time.monotonic() - start:.0f} s)", flush=True)
        s, after = producer.stats, len(bank)
    summary = {"attempts": s.fresh_attempts, "solved": s.fresh_resolved, "banked": s.failures_added,
               "errors": s.sandbox_errors, "bank_entries": after, "bank_entries_before": before,
               "sampling": args.sampling, "hf": args.hf, "collect_s": round(time.monotonic() - start)}
    if args.rows:
        from reterm_jax.tasks.bank_demos import bank_demos
        t = time.monotonic()
        summary["rows"] = bank_demos(args.bank, args.rows, jobs=args.jobs, skip_ends=skip_ends)
        summary["rows_s"] = round(time.monotonic() - t)
    print(json.dumps(summary))
    Path(args.bank, "own_failures.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
