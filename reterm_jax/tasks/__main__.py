"""`python -m reterm_jax.tasks generate|list`: seeded task families for training and held-out evaluation.

    python -m reterm_jax.tasks generate --families=all --split=train --count=200 --seed=0 --out=DIR
    python -m reterm_jax.tasks demos DIR/* --out=demos.jsonl     (train split only; needs Docker)
    python -m reterm_jax.tasks demos DIR/* --solve_rows --reuse=demos.jsonl --out=demos_solve.jsonl
    python -m reterm_jax.tasks bank_demos --bank=RUN/failure_bank --out=own.jsonl   (the agent's own failures)
    python -m reterm_jax.tasks drills --rows=4000 --seed=0 --out=drills.jsonl   (copy drills, no Docker)
    python -m reterm_jax.tasks list

Check the result with `python -m reterm_jax.sandbox check DIR/*` (oracle 1, untouched 0, and
for each fault: fault alone 0, fault then oracle 1).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from reterm_jax.tasks.families import FAMILIES
from reterm_jax.tasks.generate import generate, parse_families
from reterm_jax.tasks.pools import SPLITS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reterm_jax.tasks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write generated task directories")
    g.add_argument("--families", default="all", help=f"'all' or a comma list of: {', '.join(FAMILIES)}")
    g.add_argument("--split", required=True, choices=SPLITS,
                   help="train or heldout (disjoint pools), or novel: made-up names, train-part numbers (training only)")
    g.add_argument("--count", type=int, required=True, help="instances in all, spread evenly over the families")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", required=True, help="directory the task directories are written into")
    g.add_argument("--overwrite", action="store_true", help="replace task directories that already exist")
    d = sub.add_parser("demos", help="teacher recovery demonstrations (ReTerm-10K rows) in Docker")
    d.add_argument("task_dirs", nargs="+", metavar="TASK_DIR")
    d.add_argument("--out", required=True, help="JSONL file to write")
    d.add_argument("--jobs", type=int, default=2, help="tasks run in parallel")
    d.add_argument("--faults_per_task", type=int, default=0,
                   help="demonstrate this many of each instance's fault kinds, in turn by instance (0 = all)")
    d.add_argument("--solve_rows", action="store_true",
                   help="also one first-attempt row per instance: the oracle from the clean state, trained on")
    d.add_argument("--reuse", metavar="JSONL", default=None,
                   help="with --solve_rows: an earlier demos file of the same tasks, whose recovery rows are kept "
                        "as they are (only the first-attempt rows run)")
    b = sub.add_parser("bank_demos", help="teacher recoveries from the agent's own failures (a failure bank) in Docker")
    b.add_argument("--bank", required=True, help="a failure bank directory (RUN/failure_bank of GRPO with "
                   "bank.failures_from=policy, or experiments/learning/own_failures.py's)")
    b.add_argument("--out", required=True, help="JSONL file to write")
    b.add_argument("--jobs", type=int, default=2, help="entries run in parallel")
    b.add_argument("--skip_ends", default="", metavar="REASON,...",
                   help="leave out entries whose attempt ended so (the bank's end_reason, e.g. max_turns)")
    r = sub.add_parser("drills", help="synthetic copy-drill SFT rows (reterm_jax/tasks/drills.py)")
    r.add_argument("--rows", type=int, required=True, help="how many rows")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", required=True, help="JSONL file to write")
    sub.add_parser("list", help="the families and their fault kinds")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for f in FAMILIES.values():
            print(f"{f.name}: {', '.join(f.kinds)}")
        return 0
    if args.cmd == "drills":
        from reterm_jax.tasks.drills import write_drills
        if args.rows < 1:
            print(f"error: --rows={args.rows}: ask for at least one row", file=sys.stderr)
            return 2
        print(f"wrote {write_drills(args.out, args.rows, args.seed)} copy-drill rows (seed {args.seed}) to {args.out}")
        return 0
    if args.cmd == "bank_demos":
        import logging
        from reterm_jax.tasks.bank_demos import bank_demos, parse_end_reasons
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        start = time.monotonic()
        try:
            if args.jobs < 1:
                raise ValueError(f"--jobs={args.jobs}: run at least one entry at a time")
            n = bank_demos(args.bank, args.out, jobs=args.jobs, skip_ends=parse_end_reasons(args.skip_ends))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {n['rows']} rows from {n['entries_with_rows']} of {n['entries']} bank entries "
              f"({n['skipped']} skipped, {n['left_out']} left out by --skip_ends) to {args.out} "
              f"in {time.monotonic() - start:.0f} s")
        return 0
    if args.cmd == "demos":
        import logging
        from reterm_jax.tasks.demos import build_demos
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        try:
            start = time.monotonic()
            if args.faults_per_task < 0:
                raise ValueError(f"--faults_per_task={args.faults_per_task}: use 0 (every fault kind) or a positive count")
            if args.reuse is not None and not args.solve_rows:
                raise ValueError(f"--reuse={args.reuse} adds first-attempt rows to an earlier build: add --solve_rows")
            if args.reuse is not None and not os.path.isfile(args.reuse):
                raise ValueError(f"--reuse={args.reuse}: no such file (an earlier `demos --out` of these tasks)")
            n = build_demos(args.task_dirs, args.out, jobs=args.jobs, faults_per_task=args.faults_per_task,
                            solve_rows=args.solve_rows, reuse=args.reuse)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {n} rows from {len(args.task_dirs)} tasks to {args.out} in {time.monotonic() - start:.0f} s")
        return 0
    try:
        families = parse_families(args.families)
        start = time.monotonic()
        dirs = generate(families, args.split, args.count, args.seed, args.out, overwrite=args.overwrite)
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(dirs)} {args.split} tasks ({len(families)} families, seed {args.seed}) to {args.out} "
          f"in {time.monotonic() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
