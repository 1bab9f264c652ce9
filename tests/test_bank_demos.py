"""Teacher rows from the agent's own failures (reterm_jax/tasks/bank_demos.py): the attempt's
messages as the row's context, and, in real Docker, a banked failure of a generated train
instance recovered by the oracle, verified, with the bank left as it was."""
from __future__ import annotations

import json

import pytest

from reterm_jax.assets.build_demo_dataset import RETRY_PROMPT
from reterm_jax.rl.agent.harness import SYSTEM_PROMPT, format_observation
from reterm_jax.tasks.bank_demos import attempt_history, parse_end_reasons

HEAD = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Do the task."}]


def _call(command: str, turn: int) -> dict:
    return {"id": f"call_{turn}_0", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def _turn(command: str, turn: int, output: str = "") -> list[dict]:
    return [{"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": [_call(command, turn)]},
            {"role": "tool", "content": format_observation(output, 0, False), "tool_call_id": f"call_{turn}_0"}]


MALFORMED = [{"role": "assistant", "content": "<function=bash>ls</function>", "reasoning_content": ""},
             {"role": "tool", "content": "[error: a <function=...> block must be nested within <tool_call></tool_call> tags]"}]


def test_attempt_history_keeps_what_ran_and_drops_what_a_row_cannot_hold():
    done = {"role": "assistant", "content": "The task is complete.", "reasoning_content": ""}
    ran = _turn("cd /app", 0) + _turn("sed -i s/a/b/ f", 2)
    messages = HEAD + ran[:2] + MALFORMED + ran[2:] + [done]
    assert attempt_history(messages) == HEAD + ran + [done, {"role": "user", "content": RETRY_PROMPT}]
    # a turn with a runnable call and a malformed one keeps the call and its result
    mixed = _turn("cd /app", 0)
    mixed.insert(1, {"role": "tool", "content": "[error: expected one <function=bash> block]"})
    assert attempt_history(HEAD + mixed)[2:4] == _turn("cd /app", 0)
    # an attempt cut after a turn's calls, before their results (turn or token limit)
    cut = HEAD + _turn("cd /app", 0) + [_turn("ls", 1)[0]]
    assert attempt_history(cut) == HEAD + _turn("cd /app", 0) + [{"role": "user", "content": RETRY_PROMPT}]
    with pytest.raises(ValueError, match="system prompt and the task"):
        attempt_history(_turn("ls", 0))


def test_the_cli_refuses_a_directory_that_is_not_a_bank(tmp_path, capsys):
    from reterm_jax.tasks.__main__ import main
    assert main(["bank_demos", f"--bank={tmp_path}", f"--out={tmp_path / 'rows.jsonl'}"]) == 2
    assert "is not a failure bank" in capsys.readouterr().err
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.docker
def test_skip_ends_names_end_reasons():
    assert parse_end_reasons("") == ()
    assert parse_end_reasons(" max_turns, turn_token_limit ") == ("max_turns", "turn_token_limit")
    with pytest.raises(ValueError, match=r"--skip_ends='max_turn': 'max_turn' is not an end reason; use some of "
                                         r"completed, max_turns"):
        parse_end_reasons("max_turn")


def test_cli_refuses_an_unknown_end_reason_first(tmp_path, capsys):
    from reterm_jax.tasks.__main__ import main
    assert main(["bank_demos", f"--bank={tmp_path}", f"--out={tmp_path / 'rows.jsonl'}", "--skip_ends=max-turns"]) == 2
    assert "'max-turns' is not an end reason" in capsys.readouterr().err
    assert not (tmp_path / "rows.jsonl").exists()


def test_rows_from_a_banked_own_failure(docker_client, tmp_path):
    from reterm_jax.data.chat import encode_example
    from reterm_jax.data.schema import validate_rows
    from reterm_jax.data.tokenizer import load_tokenizer
    from reterm_jax.rl.grpo.failure_bank import FailureBank
    from reterm_jax.rl.agent.trajectory import Trajectory
    from reterm_jax.sandbox import DockerSandbox, load_task, verify
    from reterm_jax.tasks.bank_demos import bank_demos
    from reterm_jax.tasks.families import FAMILIES
    from reterm_jax.tasks.generate import generate

    (train,) = generate([FAMILIES["ini-retarget"]], "train", 1, seed=7, out=tmp_path / "train")
    (held,) = generate([FAMILIES["ini-retarget"]], "heldout", 1, seed=7, out=tmp_path / "heldout")
    bank_dir = tmp_path / "bank"

    def fail(task_dir, bank):
        """An attempt of the kind a model makes: the right command with a mis-copied value, a
        malformed call, a done claim. It runs for real, fails the verifier and is banked."""
        task = load_task(task_dir)
        wrong = "sed -i 's/^host = .*/host = not-the-host.example/' /app/config/app.ini"
        with DockerSandbox.from_task(task) as sb:
            r = sb.exec(wrong)
            assert r.ok and r.exit_code == 0
            messages = (HEAD[:1] + [{"role": "user", "content": task.instruction}]
                        + _turn(wrong, 0, r.output) + MALFORMED
                        + [{"role": "assistant", "content": "The task is complete.", "reasoning_content": ""}])
            assert not verify(sb, task).resolved
            return bank.add(sb, task, Trajectory(task.name, "e", messages, tokens=[1, 2]), policy_version=3,
                            reward=0.0, end_reason="completed")

    try:
        with FailureBank(bank_dir) as bank:
            entry = fail(train, bank)
        index = (bank_dir / "bank.json").read_text()
        out = tmp_path / "rows.jsonl"
        # leaving out the attempts that ended so runs nothing and writes no row
        counts = bank_demos(bank_dir, out, jobs=2, skip_ends=("max_turns", "completed"))
        assert counts == {"entries": 0, "rows": 0, "entries_with_rows": 0, "skipped": 0, "left_out": 1}
        assert out.read_text() == ""
        counts = bank_demos(bank_dir, out, jobs=2, skip_ends=("max_turns",))
        assert counts == {"entries": 1, "rows": 2, "entries_with_rows": 1, "skipped": 0, "left_out": 0}
        assert (bank_dir / "bank.json").read_text() == index  # the bank is left as it was
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert validate_rows(rows)[1].invalid == 0
        expected = attempt_history(entry.messages)
        assert "not-the-host.example" in json.dumps(expected) and MALFORMED[0] not in expected
        tok = load_tokenizer()
        for row in rows:
            assert row["verified_rewards"] == {"attempt_1": 0.0, "recovery": 1.0}
            assert row["target_attempt_index"] == 2 and row["task_id"] == entry.task_name
            assert row["messages"][:len(expected)] == expected  # the agent's attempt is the context
            assert row["train_from_message_index"] == len(expected)
            ex = encode_example(row, tok)
            context = tok.decode(ex.tokens[:int(ex.loss_mask.argmax())])
            assert "not-the-host.example" in context and RETRY_PROMPT in context  # never a target
        looked = [json.loads(r["messages"][len(expected)]["tool_calls"][0]["function"]["arguments"])["command"]
                  for r in rows]
        assert looked[1] == "git -C /app/config status --short"  # the family's inspection, then the oracle
        # a failure on a held-out task is refused before anything runs
        with FailureBank(bank_dir) as bank:
            fail(held, bank)
        with pytest.raises(ValueError, match="heldout-split task"):
            bank_demos(bank_dir, tmp_path / "no.jsonl")
        assert not (tmp_path / "no.jsonl").exists()
    finally:
        FailureBank(bank_dir).destroy()
