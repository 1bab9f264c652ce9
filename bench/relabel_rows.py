"""More made-up-name SFT rows without Docker: each row again with fresh values, renamed throughout.

A novel-split demonstration (`python -m reterm_jax.tasks demos`, made-up names) is right only by
copying its values, but 1,536 rows seen eight times over also let a tiny model memorise them
(docs/learning.md, run 10). This writes `--copies` versions of every row in which each value the
instruction quotes (what `bench/copy_loss.py` calls a value: a backtick-quoted string that is not
the same in every row of the family) is replaced, in every message and tool call, by a fresh one
of the same shape: letters made up as the novel split makes them (separators and digits kept),
numbers drawn from the pool's train part. A replaced value matches only whole (not inside a longer
word or number). The teacher's commands and observations are otherwise untouched, so each copy
is a demonstration of the same recovery on an instance with other names. Never feed it held-out
rows: its purpose is names no pool has.

    python bench/relabel_rows.py --rows OUT/demos_novel.jsonl --copies 5 --seed 0 --out OUT/relabeled.jsonl

Prints how many rows and values it wrote.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]

from copy_loss import constant_quotes, family, quoted_values  # noqa: E402  (bench/)
from reterm_jax.tasks import pools  # noqa: E402


@functools.lru_cache(maxsize=None)
def _train_numbers(digits: int) -> tuple[str, ...]:
    """The port pool's train-part numbers with this many digits (split once, not per value)."""
    return tuple(str(x) for x in pools.part("port", "train") if len(str(x)) == digits)


def fresh_value(rng: random.Random, value: str, taken: set[str]) -> str:
    """A new value shaped like `value`: a number of as many digits from the port pool's train part,
    or each run of letters made up anew (pools.made_up_like); never one of `taken`."""
    numbers = _train_numbers(len(value)) if value.isdigit() else ()
    while True:
        if value.isdigit():
            new = rng.choice(numbers) if numbers else str(rng.randrange(10 ** (len(value) - 1), 10 ** len(value)))
        else:
            new = pools.made_up_like(rng, value)
        if new != value and new not in taken:
            return new


def relabel(row: dict, values: list[str], rng: random.Random) -> dict:
    """`row` with every whole occurrence of each of `values` replaced by a fresh value (all at once,
    so a new value is never replaced again)."""
    taken: set[str] = set(values)
    mapping = {}
    for v in values:
        mapping[v] = fresh_value(rng, v, taken)
        taken.add(mapping[v])
    alternation = "|".join(re.escape(v) for v in sorted(mapping, key=len, reverse=True))
    pattern = re.compile(rf"(?<![A-Za-z0-9])(?:{alternation})(?![A-Za-z0-9])")

    def sub(text):
        return pattern.sub(lambda m: mapping[m.group()], text) if isinstance(text, str) else text

    out = json.loads(json.dumps(row))
    for m in out["messages"]:
        if "content" in m:
            m["content"] = sub(m["content"])
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call)
            if isinstance(fn.get("arguments"), str):
                fn["arguments"] = sub(fn["arguments"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", action="append", required=True, help="demonstration rows (JSONL; repeatable)")
    ap.add_argument("--copies", type=int, default=5, help="renamed versions of each row")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSONL file to write")
    args = ap.parse_args()
    if args.copies < 1:
        ap.error(f"--copies={args.copies}: give 1 or more")
    rows = []
    for path in args.rows:
        if not os.path.exists(path):
            ap.error(f"--rows {path!r}: no such file")
        rows += [json.loads(line) for line in open(path)]
    constant = constant_quotes(rows)
    rng = random.Random(args.seed)
    n_values = 0
    with open(args.out, "w") as f:
        for _ in range(args.copies):
            for row in rows:
                values = quoted_values(row, constant[family(row)])
                n_values += len(values)
                f.write(json.dumps(relabel(row, values, rng)) + "\n")
    print(f"wrote {len(rows) * args.copies} rows ({args.copies} per row, {n_values} values renamed) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
