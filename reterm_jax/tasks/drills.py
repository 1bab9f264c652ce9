"""Copy drills: synthetic SFT rows that teach a model from scratch to copy what the context says.

A generated task's fix has to carry the instance's values (a section, a host, a branch name) from
the instruction into a command. A pretrained LM copies for free; the tiny model of the learning run
starts from random weights and, trained on the demonstrations alone, learns every command but
guesses the values from the train pools (~72% of value tokens right, on trained and unseen
instances alike; experiments/learning/notebook.md). A drill row makes copying the whole loss: the user names 2-7
random keys with random values in backticks, asks for them in a given order, some filler output may
sit between, and the target turn writes one command with each key's value, in that order. Keys and
values are random characters (no task family's pools, so nothing of the held-out split), in one of
a few command shapes, so the skill is "find the value this slot names and copy it token by token",
not one format.

    python -m reterm_jax.tasks drills --rows 4000 --seed 0 --out drills.jsonl

The rows are ReTerm-10K rows (`reterm_jax.data` trains on them as on any others; the loss starts at
the target turn). Nothing is run: the commands are never executed, only written. Measured so far
(experiments/learning/notebook.md): the random-weight tiny model does not start copying from drills alone
within 600 steps of 4 packed rows; no pipeline uses them yet.
"""
from __future__ import annotations

import json
import random
import string

from reterm_jax.assets.build_demo_dataset import call, make_row
from reterm_jax.data.sources import save_rows
from reterm_jax.rl.agent.harness import SYSTEM_PROMPT, format_observation
from reterm_jax.tasks.pools import POOLS

TASK_ID = "copy-drill"
_VALUE_CHARS = string.ascii_lowercase + string.digits + "-._"
_POOLED = frozenset(str(v) for pool in POOLS.values() for v in pool)  # never a drill value
_FILLER_WORDS = ("note", "entry", "value", "item", "line", "record", "status", "ok", "pending", "done",
                 "check", "list", "file", "path", "user", "group", "size", "mode", "time", "date")


def _name(rng: random.Random, taken: set[str]) -> str:
    while True:
        n = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8)))
        if n not in taken:
            taken.add(n)
            return n


def _value(rng: random.Random) -> str:
    while True:
        kind = rng.random()
        if kind < 0.25:
            v = str(rng.randint(10, 65535))
        elif kind < 0.5:  # dotted, host-like
            v = ".".join("".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(rng.randint(2, 7)))
                         for _ in range(rng.randint(2, 3)))
        else:
            v = rng.choice(string.ascii_lowercase) + "".join(rng.choice(_VALUE_CHARS) for _ in range(rng.randint(2, 15)))
        if v not in _POOLED:
            return v


def _filler(rng: random.Random, lines: int) -> str:
    return "\n".join(" ".join(rng.choice(_FILLER_WORDS) + (str(rng.randint(0, 99)) if rng.random() < 0.3 else "")
                              for _ in range(rng.randint(2, 8))) for _ in range(lines))


def _command(rng: random.Random, pairs: list[tuple[str, str]]) -> str:
    shape = rng.randrange(4)
    if shape == 0:
        return "printf '%s\\n' " + " ".join(f"'{k}={v}'" for k, v in pairs) + " > /tmp/settings.txt"
    if shape == 1:
        return " && ".join(f"echo \"{k} = {v}\" >> /tmp/settings.ini" for k, v in pairs)
    if shape == 2:
        body = "\n".join(f"    {json.dumps(k)}: {json.dumps(v)}," for k, v in pairs)
        return f"python3 - <<'PY'\nimport json\nsettings = {{\n{body}\n}}\njson.dump(settings, open('/tmp/settings.json', 'w'))\nPY"
    return " && ".join(f"export {k.upper()}={v}" for k, v in pairs)


def drill_row(rng: random.Random) -> dict:
    taken: set[str] = set()
    pairs = [(_name(rng, taken), _value(rng)) for _ in range(rng.randint(2, 7))]
    order = pairs[:]
    rng.shuffle(order)
    told = ", ".join(f"`{k}` is `{v}`" for k, v in pairs)
    user = (f"Record these settings: {told}.\n\nWrite them in this order: "
            f"{', '.join(f'`{k}`' for k, _ in order)}. Keep every value exactly as given.\n")
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    for i in range(rng.choice((0, 0, 0, 1, 2))):  # filler turns put the values further back
        messages += [{"role": "assistant", "content": "", "tool_calls": [call(f"cat /tmp/notes{i}.txt", i)]},
                     {"role": "tool", "content": format_observation(_filler(rng, rng.randint(2, 16)), 0)}]
    train_from = len(messages)
    messages += [{"role": "assistant", "content": "", "tool_calls": [call(_command(rng, order), 50)]},
                 {"role": "tool", "content": format_observation("", 0)},
                 {"role": "assistant", "content": "The task is complete."}]
    row = make_row(TASK_ID, messages, train_from, {"drill": 1.0})
    row["target_attempt_index"] = 1
    return row


def drill_rows(count: int, seed: int = 0) -> list[dict]:
    """`count` drill rows; the same seed gives the same rows."""
    if count < 0:
        raise ValueError(f"drill rows: count={count}; use 0 or more")
    rng = random.Random(f"copy-drill:{seed}")
    return [drill_row(rng) for _ in range(count)]


def write_drills(out: str, count: int, seed: int = 0) -> int:
    rows = drill_rows(count, seed)
    save_rows(rows, out)
    return len(rows)
