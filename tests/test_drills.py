"""Copy drills (reterm_jax/tasks/drills.py): seeded, valid ReTerm-10K rows whose target turn writes
every key's value, in the asked order, and whose values come from no task family's pools."""
from __future__ import annotations

import json
import re

from reterm_jax.data import load_tokenizer
from reterm_jax.data.chat import encode_example
from reterm_jax.data.schema import validate_rows
from reterm_jax.tasks.__main__ import main as cli
from reterm_jax.tasks.drills import drill_rows
from reterm_jax.tasks.pools import POOLS


def _target_command(row: dict) -> str:
    args = row["messages"][row["train_from_message_index"]]["tool_calls"][0]["function"]["arguments"]
    return json.loads(args)["command"]


def test_same_seed_same_rows_another_seed_other_rows():
    assert drill_rows(20, seed=3) == drill_rows(20, seed=3)
    assert drill_rows(20, seed=3) != drill_rows(20, seed=4)


def test_rows_are_valid_and_train_only_the_target_turns():
    rows = drill_rows(40, seed=0)
    good, report = validate_rows(rows)
    assert report.valid == 40 and report.invalid == 0
    tok = load_tokenizer()
    for row in good[:5]:
        ex = encode_example(row, tok)
        targets = [t for t, m in zip(ex.tokens, ex.loss_mask) if m]
        text = tok.decode(targets)
        # the target turn and the closing claim are trained; the instruction and filler are not
        assert "Record these settings" not in text and "cat /tmp/notes" not in text
        assert "The task is complete." in text


def test_the_target_writes_each_value_in_the_asked_order():
    for row in drill_rows(60, seed=1):
        user = row["messages"][1]["content"]
        told = dict(re.findall(r"`([a-z]+)` is `([^`]+)`", user))
        order = re.findall(r"`([a-z]+)`", user.split("in this order:")[1])
        assert sorted(order) == sorted(told) and 2 <= len(told) <= 7
        command = _target_command(row)
        positions = [command.index(told[k]) for k in order]  # every value, copied exactly
        assert positions == sorted(positions), (user, command)


def test_values_come_from_no_task_pool():
    pooled = {str(v) for pool in POOLS.values() for v in pool}
    for row in drill_rows(200, seed=2):
        for value in re.findall(r"` is `([^`]+)`", row["messages"][1]["content"]):
            assert value not in pooled


def test_cli_writes_rows_and_refuses_a_bad_count(tmp_path, capsys):
    out = tmp_path / "d.jsonl"
    assert cli(["drills", "--rows", "5", "--seed", "1", "--out", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == drill_rows(5, seed=1)
    assert cli(["drills", "--rows", "0", "--out", str(out)]) == 2
    assert "--rows=0" in capsys.readouterr().err
