"""More made-up-name SFT rows without Docker: each row again with fresh values, renamed throughout.

A novel-split demonstration (`python -m reterm_jax.tasks demos`, made-up names) is right only by
copying its values, but 1,536 rows seen eight times over also let a tiny model memorise them
(experiments/learning/notebook.md, run 10). This writes `--copies` versions of every row in which each value the
instruction quotes (what `experiments/learning/copy_loss.py` calls a value: a backtick-quoted string that is not
the same in every row of the family) is replaced, in every message and tool call, by a fresh one
of the same shape: letters made up as the novel split makes them (separators and digits kept),
numbers drawn from the pool's train part. A replaced value matches only whole (not inside a longer
word or number). The teacher's commands and observations are otherwise untouched, so each copy
is a demonstration of the same recovery on an instance with other names. Never feed it held-out
rows: its purpose is names no pool has.

`--names tokens` makes each run of letters out of the tokenizer's **least-written name tokens**
instead (lower-case tokens of two or more letters, counted over the rows written so far, the input
rows included; never a letter run of any pool item). A model can only write a token its SFT rows
made it write: no policy evaluated in runs 20-31 ever solved a held-out instance whose domain
ends in `.example`, because the token `amp` (`ex` `amp` `le`) was in none of the 6,114 rows of
their SFT files (experiments/learning/notebook.md, run 32).
These rows make every such token a copied value a few times over, whatever the held-out pools hold.

`--names prefixed` begins each run of letters with a token that begins a value of the input rows
(the first token of a letter run of two or more tokens, drawn as often as the rows begin a run
with it) and goes on with a least-written name token. A model that has learned which token
follows `ex` in its rows' values (`exactly`: `ex` `actl` `y`) writes that pair again where a
held-out value needs another (`examples`: `ex` `amp` `les`; experiments/learning/notebook.md, run 34); in these
rows the same first token goes on differently in every value, so only the instruction says what
comes next.

    python experiments/learning/relabel_rows.py --rows OUT/demos_novel.jsonl --copies 5 --seed 0 --out OUT/relabeled.jsonl
    python experiments/learning/relabel_rows.py --rows ROWS --names tokens --copies 1 --out OUT/covering.jsonl
    python experiments/learning/relabel_rows.py --rows ROWS --names prefixed --copies 3 --out OUT/prefixed.jsonl

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

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")]

from copy_loss import constant_quotes, family, quoted_values  # noqa: E402  (experiments/learning/)
from reterm_jax.tasks import pools  # noqa: E402

# every run of letters of every pool item, held-out ones included: never a token name
_POOL_RUNS = frozenset(run for items in pools.POOLS.values() for x in items for run in re.findall(r"[a-z]+", str(x)))


@functools.lru_cache(maxsize=None)
def _train_numbers(digits: int) -> tuple[str, ...]:
    """The port pool's train-part numbers with this many digits (split once, not per value)."""
    return tuple(str(x) for x in pools.part("port", "train") if len(str(x)) == digits)


def _text(row: dict) -> str:
    """What the rows make a model read and write: every message's content and tool-call arguments."""
    parts = []
    for m in row["messages"]:
        parts.append(m.get("content") or "")
        parts += [(c.get("function", c)).get("arguments") or "" for c in m.get("tool_calls") or []]
    return "\n".join(p if isinstance(p, str) else json.dumps(p) for p in parts)


class TokenNames:
    """Runs of letters made of the tokenizer's least-written name tokens.

    The candidates are the vocabulary's lower-case tokens of two or more letters that are not a
    letter run of any pool item; `count(row)` adds a row's tokens to the tally, and `letters(rng)`
    picks one of the least-written candidates (ties at random), alone or followed by another."""

    def __init__(self, tokenizer, rows: list[dict]):
        self.tokenizer = tokenizer
        self.counts = {i: 0 for i in range(len(tokenizer))
                       if re.fullmatch(r"[a-z]{2,}", tokenizer.decode([i]) or "")
                       and tokenizer.decode([i]) not in _POOL_RUNS}
        for row in rows:
            self.count(row)

    def count(self, row: dict) -> None:
        for i in self.tokenizer.encode(_text(row), add_special_tokens=False):
            if i in self.counts:
                self.counts[i] += 1

    def unwritten(self) -> int:
        return sum(1 for c in self.counts.values() if c == 0)

    def _least(self, rng: random.Random) -> str:
        low = min(self.counts.values())
        return self.tokenizer.decode([rng.choice(sorted(i for i, c in self.counts.items() if c == low))])

    def letters(self, rng: random.Random) -> str:
        while True:
            word = self._least(rng) + (self._least(rng) if rng.random() < 0.5 else "")
            if word not in _POOL_RUNS:
                return word


class PrefixedNames(TokenNames):
    """Runs of letters that begin with a token that begins the input rows' values and go on with a
    least-written name token, so the first token never tells what follows it."""

    def __init__(self, tokenizer, rows: list[dict], values: list[str]):
        super().__init__(tokenizer, rows)
        firsts: dict[int, int] = {}
        for value in values:
            for run in re.findall(r"[a-z]+", value):
                ids = tokenizer.encode(run, add_special_tokens=False)
                if len(ids) >= 2:
                    firsts[ids[0]] = firsts.get(ids[0], 0) + 1
        if not firsts:
            raise ValueError("no quoted value of the rows has a run of letters of two or more tokens to take a first token from")
        self.firsts, self.weights = sorted(firsts), [firsts[i] for i in sorted(firsts)]

    def letters(self, rng: random.Random) -> str:
        while True:
            first = rng.choices(self.firsts, self.weights)[0]
            word = self.tokenizer.decode([first]) + self._least(rng)
            ids = self.tokenizer.encode(word, add_special_tokens=False)
            # the tokenizer must split it after the first token, or the pair is not the one taught
            if len(ids) >= 2 and ids[0] == first and word not in _POOL_RUNS:
                return word


def fresh_value(rng: random.Random, value: str, taken: set[str], names: TokenNames | None = None) -> str:
    """A new value shaped like `value`: a number of as many digits from the port pool's train part,
    or each run of letters made up anew (pools.made_up_like, or `names`' least-written tokens);
    never one of `taken`."""
    numbers = _train_numbers(len(value)) if value.isdigit() else ()
    while True:
        if value.isdigit():
            new = rng.choice(numbers) if numbers else str(rng.randrange(10 ** (len(value) - 1), 10 ** len(value)))
        elif names is not None:
            new = re.sub(r"[a-z]+", lambda m: names.letters(rng), value)
        else:
            new = pools.made_up_like(rng, value)
        if new != value and new not in taken and (value.isdigit() or new not in pools._EVERY_ITEM):
            return new


def relabel(row: dict, values: list[str], rng: random.Random, names: TokenNames | None = None) -> dict:
    """`row` with every whole occurrence of each of `values` replaced by a fresh value (all at once,
    so a new value is never replaced again); with `names`, letters from its least-written tokens,
    and the new row is counted."""
    taken: set[str] = set(values)
    mapping = {}
    for v in values:
        mapping[v] = fresh_value(rng, v, taken, names)
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
    if names is not None:
        names.count(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", action="append", required=True, help="demonstration rows (JSONL; repeatable)")
    ap.add_argument("--copies", type=int, default=5, help="renamed versions of each row")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--names", default="made_up", choices=("made_up", "tokens", "prefixed"),
                    help="letters made up as the novel split makes them, of the tokenizer's least-written "
                         "name tokens (counted over the input rows and every row written), or a token that "
                         "begins the rows' values followed by a least-written one")
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
    values = [quoted_values(row, constant[family(row)]) for row in rows]  # the same for every copy
    rng = random.Random(args.seed)
    names = None
    if args.names in ("tokens", "prefixed"):
        from reterm_jax.data.tokenizer import load_tokenizer
        if args.names == "tokens":
            names = TokenNames(load_tokenizer(), rows)
        else:
            try:
                names = PrefixedNames(load_tokenizer(), rows, [v for vs in values for v in vs])
            except ValueError as e:
                ap.error(f"--names prefixed: {e}")
            most = sorted(zip(names.weights, names.firsts), reverse=True)[:8]
            print(f"first tokens: {len(names.firsts)} (most drawn: {', '.join(names.tokenizer.decode([i]) for _, i in most)})")
        print(f"name tokens never written in the input rows: {names.unwritten()} of {len(names.counts)}")
    n_values = 0
    with open(args.out, "w") as f:
        for copy in range(args.copies):
            for row, row_values in zip(rows, values):
                n_values += len(row_values)
                new = relabel(row, row_values, rng, names)
                # its own id: the SFT loader keeps only the first row of an id, so a copy that kept
                # its source's id would be dropped beside the source, or beside another copy
                new["id"] = f"{row['id']}~{args.names}{copy}"
                f.write(json.dumps(new) + "\n")
    print(f"wrote {len(rows) * args.copies} rows ({args.copies} per row, {n_values} values renamed) to {args.out}")
    if names is not None:
        print(f"name tokens never written after them: {names.unwritten()} of {len(names.counts)}; "
              f"the least-written now {min(names.counts.values())} times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
