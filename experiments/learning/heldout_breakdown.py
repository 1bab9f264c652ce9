"""Which held-out instances does no policy solve, and is it a value no SFT row ever wrote?

A held-out score is a mean over instances that differ in their values (a host's domain, an app's
name). Run 32 (experiments/learning/notebook.md) found, by splitting 35 evaluation files by domain, that 42 of the
64 held-out ini-retarget instances had never been solved in 41,160 attempts: their domain needs
the token `amp`, which no SFT row had made the model write. This does that split for any learning
run, so the next such wall is seen after the first evaluation rather than the thirty-fifth:

1. For each generator parameter that groups the instances (a scalar of task.toml's
   `[metadata.generator.params]` with at least 2 values and at most a quarter as many values as
   instances, or those named by `--by`), the resolved trials out of all trials per value, per
   evaluation file and in all of them together; a value no trial ever resolved is marked.
2. With `--rows` (the SFT rows the policies trained on): the tokens each instance's solution must
   write for a value it copies (a backtick-quoted string of the instruction, as the oracle's
   `solution/solve.sh` tokenises it) that the rows never wrote (loss-masked positions), and the
   instances' scores split by whether they need one. Reading held-out instances chooses nothing
   here: it says what a score can reach; never pick a checkpoint or rows by it.

    python experiments/learning/heldout_breakdown.py --tasks OUT/tasks/heldout --eval OUT/eval_warm_start.json \
        --eval OUT/eval_grpo.json [--rows OUT/sft_rows_own.jsonl] [--by domain] [--json FILE]

Prints markdown tables; asserts nothing.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

_SCALAR = (str, int, float, bool)


def instance_params(tasks: Path) -> dict[str, dict]:
    """task name -> its generator params, for every generated task directly under `tasks`."""
    out = {}
    for toml in sorted(tasks.glob("*/task.toml")):
        with open(toml, "rb") as f:
            gen = tomllib.load(f).get("metadata", {}).get("generator")
        if gen is not None:
            out[toml.parent.name] = gen.get("params", {})
    if not out:
        raise ValueError(f"--tasks {str(tasks)!r}: no generated task (task.toml with [metadata.generator]) under it")
    return out


def grouping_params(params: dict[str, dict]) -> list[str]:
    """Scalar params with 2 or more values, and at most a quarter as many values as instances."""
    values = collections.defaultdict(set)
    for p in params.values():
        for k, v in p.items():
            if isinstance(v, _SCALAR):
                values[k].add(v)
    return sorted(k for k, vs in values.items() if 2 <= len(vs) <= max(2, len(params) // 4))


def trial_tally(evaluation: dict) -> dict[str, list[int]]:
    """task -> [resolved trials, trials] over every protocol of one evaluation file (errored
    trials left out, as the scores leave them out)."""
    out = collections.defaultdict(lambda: [0, 0])
    for t in evaluation["trials"]:
        if t.get("error"):
            continue
        out[t["task"]][0] += int(bool(t["resolved"]))
        out[t["task"]][1] += 1
    return dict(out)


def by_value(params: dict[str, dict], key: str, tallies: list[dict[str, list[int]]]) -> dict:
    """value of `key` -> {"instances": n, "per_file": [[resolved, trials], ...], "all": [r, t]}."""
    out = {}
    for task, p in params.items():
        row = out.setdefault(str(p.get(key)), {"instances": 0, "per_file": [[0, 0] for _ in tallies], "all": [0, 0]})
        row["instances"] += 1
        for i, tally in enumerate(tallies):
            r, n = tally.get(task, (0, 0))
            row["per_file"][i][0] += r
            row["per_file"][i][1] += n
            row["all"][0] += r
            row["all"][1] += n
    return dict(sorted(out.items()))


def written_tokens(rows: list[dict], tokenizer) -> collections.Counter:
    """How often each token is a target (loss-masked position) in the rendered rows."""
    from reterm_jax.data.chat import RowError, encode_example
    counts = collections.Counter()
    for row in rows:
        try:
            ex = encode_example(row, tokenizer)
        except RowError:
            continue
        counts.update(int(t) for t, m in zip(ex.tokens, ex.loss_mask) if m)
    return counts


def copied_tokens(task_dir: Path, tokenizer) -> dict[str, list[int]]:
    """value -> the tokens of `solution/solve.sh` that overlap it, for each backtick-quoted string
    of the instruction that the solution writes (the tokens a policy must write to copy it)."""
    instruction = (task_dir / "instruction.md").read_text()
    solve = (task_dir / "solution" / "solve.sh").read_text()
    enc = tokenizer(solve, return_offsets_mapping=True, add_special_tokens=False)
    out = {}
    for value in dict.fromkeys(re.findall(r"`([^`\n]+)`", instruction)):
        spans = [m.span() for m in re.finditer(rf"(?<![A-Za-z0-9]){re.escape(value)}(?![A-Za-z0-9])", solve)]
        ids = [t for t, (s, e) in zip(enc["input_ids"], enc["offset_mapping"]) if any(s < b and e > a for a, b in spans)]
        if ids:
            out[value] = list(dict.fromkeys(ids))
    return out


def unwritten_needs(tasks: Path, names: list[str], written: collections.Counter, tokenizer) -> dict[str, list[int]]:
    """task -> the tokens its copied values need that `written` never counted."""
    out = {}
    for name in names:
        need = [t for ids in copied_tokens(tasks / name, tokenizer).values() for t in ids]
        out[name] = sorted({t for t in need if written[t] == 0})
    return out


def column_names(paths: list[str]) -> list[str]:
    """Each file's shortest distinct path tail, without `.json` (`run33/run/eval_warm_start`)."""
    parts = [Path(p).resolve().with_suffix("").parts for p in paths]
    for depth in range(1, max(len(x) for x in parts) + 1):
        names = ["/".join(x[-depth:]) for x in parts]
        if len(set(names)) == len(names):
            return names
    return names


def _cell(r: int, n: int) -> str:
    return f"{r}/{n} ({100 * r / n:.1f}%)" if n else "-"


def _row(label: str, count: int, per_file: list[list[int]]) -> str:
    """One table line: label, instances, resolved/trials per file and over all files."""
    total = [sum(c[0] for c in per_file), sum(c[1] for c in per_file)]
    return f"| {label} | {count} | " + " | ".join(_cell(*c) for c in per_file) + f" | {_cell(*total)} |"


def _header(first: str, names: list[str]) -> str:
    return f"\n| {first} | instances | " + " | ".join(names) + " | all files |\n|---|---|" + "---|" * (len(names) + 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", required=True, help="the held-out task dirs' folder (OUT/tasks/heldout)")
    ap.add_argument("--eval", action="append", required=True, help="an evaluation file (OUT/eval_*.json; repeatable)")
    ap.add_argument("--rows", action="append", default=[], help="SFT rows the policies trained on (JSONL; repeatable)")
    ap.add_argument("--by", action="append", default=[], help="a generator param to group by (repeatable; default: auto)")
    ap.add_argument("--json", help="also write the tables here")
    args = ap.parse_args()
    for path in [*args.eval, *args.rows]:
        if not os.path.exists(path):
            ap.error(f"{path!r}: no such file")
    try:
        params = instance_params(Path(args.tasks))
    except ValueError as e:
        ap.error(str(e))
    keys = args.by or grouping_params(params)
    unknown = [k for k in keys if not any(k in p for p in params.values())]
    if unknown:
        ap.error(f"--by {unknown[0]!r}: no instance has that param; they have {sorted({k for p in params.values() for k in p})}")
    evals = [json.load(open(p)) for p in args.eval]
    tallies = [trial_tally(e) for e in evals]
    missing = sorted(set(params) - {t for tally in tallies for t in tally})
    if missing:
        print(f"note: {len(missing)} of {len(params)} instances have no trial in any file (e.g. {missing[0]})")
    names = column_names(args.eval)
    report = {"instances": len(params), "files": args.eval, "by": {}}
    for key in keys:
        table = by_value(params, key, tallies)
        report["by"][key] = table
        print(_header(key, names))
        for value, row in table.items():
            mark = " **never solved**" if row["all"][1] and row["all"][0] == 0 else ""
            print(_row(f"{value}{mark}", row["instances"], row["per_file"]))
    if args.rows:
        from reterm_jax.data.tokenizer import load_tokenizer
        tokenizer = load_tokenizer()
        rows = [json.loads(line) for path in args.rows for line in open(path) if line.strip()]
        written = written_tokens(rows, tokenizer)
        needs = unwritten_needs(Path(args.tasks), list(params), written, tokenizer)
        split = {"needs an unwritten token": [t for t, toks in needs.items() if toks],
                 "every token written": [t for t, toks in needs.items() if not toks]}
        print(f"\n{len(rows)} rows write {sum(written.values()):,} target tokens, {len(written)} distinct")
        print(_header("copied values", names))
        for label, group in split.items():
            print(_row(label, len(group), [[sum(t.get(k, (0, 0))[0] for k in group),
                                            sum(t.get(k, (0, 0))[1] for k in group)] for t in tallies]))
        per_token = collections.Counter(t for toks in needs.values() for t in toks)
        if per_token:
            print("\nunwritten tokens the instances need: "
                  + ", ".join(f"{tokenizer.decode([t])!r} ({n} instances)" for t, n in per_token.most_common()))
        report["unwritten"] = {task: [tokenizer.decode([t]) for t in toks] for task, toks in needs.items()}
        report["rows"] = {"files": args.rows, "count": len(rows), "target_tokens": sum(written.values())}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
