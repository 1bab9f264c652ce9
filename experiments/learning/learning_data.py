"""The learning run's tasks and SFT rows (experiments/learning/learning_run.py, stages 1-2): generated instances
of each split, teacher demonstrations of the training ones, and the limits the longest row sets."""
from __future__ import annotations

import glob
import json
import os
import shutil
import time
from pathlib import Path

import learning_report


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def task_dirs(out: Path, name: str) -> list[Path]:
    return sorted(Path(d) for d in glob.glob(str(out / "tasks" / name / "*")) if os.path.isdir(d))


def fit_slice(train: list[Path], val: list[Path]) -> list[Path]:
    """The train-fit slice: as many train instances as the validation slice holds, evenly spaced
    (the learning run scores each SFT candidate on both; experiments/learning/policy_fit.py scores any policy)."""
    return train[::max(1, len(train) // max(1, len(val)))][:len(val)]


def task_plan(args) -> dict[str, tuple[str, int, int]]:
    """Each task set's (split, count, seed). `val` is a validation slice of a training split
    (--val_split: train pools, or made-up names); `heldout` is the only one from held-out pools."""
    spec = {"train": ("train", args.train, args.seed), "val": (args.val_split, args.val, args.seed + 1000),
            "heldout": ("heldout", args.heldout, args.seed)}
    if args.grpo_train:  # training-split instances no demonstration showed: GRPO's tasks
        spec["grpo"] = (args.grpo_split, args.grpo_train, args.seed + 2000)
    if args.novel_train:  # made-up names: rows only copying gets right
        spec["novel"] = ("novel", args.novel_train, args.seed + 3000)
    if getattr(args, "words_train", 0):  # English-word names: the tokens real names are made of
        spec["words"] = ("words", args.words_train, args.seed + 4000)
    return spec


def make_tasks(out: Path, args) -> dict[str, list[Path]]:
    from reterm_jax.tasks.demos import generator_meta
    from reterm_jax.tasks.generate import generate, parse_families
    families = parse_families(args.families)
    spec = task_plan(args)
    for name, (split, count, seed) in spec.items():
        have = task_dirs(out, name)
        if len(have) != count or (have and generator_meta(have[0])["split"] != split):
            shutil.rmtree(out / "tasks" / name, ignore_errors=True)  # same arguments write the same bytes
            generate(families, split, count, seed, out / "tasks" / name)
    return {name: task_dirs(out, name) for name in spec}


def make_demos(out: Path, dirs: list[Path], jobs: int, faults_per_task: int = 0, name: str = "demos",
               solve_rows: bool = False) -> Path:
    from reterm_jax.tasks.demos import build_demos
    plain = out / f"{name}.jsonl"
    name += "_solve" if solve_rows else ""  # another file: the rows made without them stay as they were
    path = out / f"{name}.jsonl"
    if not path.exists():
        tmp = out / f"{name}.jsonl.tmp"
        reuse = plain if solve_rows and plain.exists() else None  # only the first-attempt rows run
        n = build_demos([str(d) for d in dirs], tmp, jobs=jobs, faults_per_task=faults_per_task, solve_rows=solve_rows,
                        reuse=reuse)
        tmp.rename(path)
        log(f"{name}: {n} rows from {len(dirs)} instances")
    return path


def sft_rows(out: Path, dirs: dict[str, list[Path]], args) -> Path:
    """The SFT rows: demonstrations of the train instances, plus (--novel_train, --words_train)
    those of the novel- and words-split instances, in one file (OUT/sft_rows.jsonl) so every SFT
    phase and the control read the same rows; with --solve_rows each instance's first-attempt
    row too (files named *_solve.jsonl)."""
    solve = bool(getattr(args, "solve_rows", False))
    demos = make_demos(out, dirs["train"], args.jobs, args.faults_per_task, solve_rows=solve)
    extra = [make_demos(out, dirs[name], args.jobs, args.faults_per_task, name=f"demos_{name}", solve_rows=solve)
             for name in ("novel", "words") if name in dirs]
    if extra:
        demos = _joined(out / ("sft_rows_solve.jsonl" if solve else "sft_rows.jsonl"), [demos, *extra])
    own = [Path(p) for p in getattr(args, "extra_rows", [])]
    if own:
        demos = _joined(out / "sft_rows_extra.jsonl", [demos, *own])
    return demos


def extra_rows(out: Path, args) -> Path:
    """--extra_rows alone, in one file (OUT/sft_rows_own.jsonl): what --sft_on=extra trains on."""
    return _joined(out / "sft_rows_own.jsonl", [Path(p) for p in args.extra_rows])


def _joined(path: Path, parts: list[Path]) -> Path:
    if not path.exists():
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(p.read_bytes() for p in parts))
        tmp.rename(path)
        log(f"{path.name}: {sum(1 for _ in open(path))} rows from {', '.join(p.name for p in parts)}")
    return path


def demo_limits(path: Path, tokenizer_dir: str | None = None) -> dict:
    """The limits the longest row sets, counted in the tokens of the model's tokenizer (default: the tiny one)."""
    from reterm_jax.data import load_tokenizer
    from reterm_jax.data.chat import encode_example
    from reterm_jax.data.tokenizer import TINY_TOKENIZER_DIR
    rows = [json.loads(line) for line in open(path)]
    tok = load_tokenizer(tokenizer_dir or TINY_TOKENIZER_DIR)
    encoded = [encode_example(r, tok) for r in rows]  # build_demos validated every row
    longest = max(len(ex) for ex in encoded)
    turn = max(learning_report.longest_run(ex.loss_mask) for ex in encoded)
    limits = learning_report.run_limits(longest, max(learning_report.recovery_calls(r) for r in rows), turn)
    return {**limits, "rows": len(rows), "longest_row": longest, "longest_turn": turn,
            "target_tokens": int(sum(int(ex.loss_mask.sum()) for ex in encoded))}


def steps_for_tokens(path: Path, tokenizer_dir: str, *, seq_len: int, batch_size: int, seed: int,
                     target_tokens: float) -> tuple[int, float]:
    """How many SFT steps on the rows at `path` train `target_tokens` loss tokens: the batches
    configs/sft.py's pipeline feeds a run with this seed, seq_len and batch (rows repeat forever,
    overlong rows dropped), counted until their loss tokens reach the target. (steps, their tokens)."""
    from reterm_jax.data import BASH_TOOL, load_and_validate, load_tokenizer, sft_dataset
    rows, _ = load_and_validate(str(path))
    dataset, _ = sft_dataset(rows, load_tokenizer(tokenizer_dir), seq_len=seq_len, batch_size=batch_size, seed=seed,
                             num_epochs=None, overlong="drop", tools=[BASH_TOOL], shard_index=0, shard_count=1)
    steps, tokens = 0, 0.0
    for batch in dataset:
        if tokens >= target_tokens:
            break
        steps, tokens = steps + 1, tokens + float(batch["target_mask"].sum())
    return steps, tokens
