"""Generated tasks in real Docker: one instance of every family (the fault kinds rotate),
from the held-out split, the novel split (made-up names), the words split (English words) and the
tokens split (the tokenizer's own tokens) passes the same check as the bundled recovery tasks: oracle 1,
untouched 0, fault alone 0, fault then oracle 1."""
from __future__ import annotations

import json

import pytest

from reterm_jax.sandbox import check_tasks
from reterm_jax.tasks.families import FAMILIES
from reterm_jax.tasks.generate import generate

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("split,shift", [("heldout", 0), ("novel", 1), ("words", 2), ("tokens", 0)])
def test_one_instance_per_family_passes_check(docker_client, tmp_path, split, shift):
    families = list(FAMILIES.values())
    dirs = generate(families, split, 3 * len(families), seed=3, out=tmp_path)
    # instance i is family i mod F with kind i div F: take family f's instance of kind (f + shift) mod 3
    picked = [dirs[((f + shift) % 3) * len(families) + f] for f in range(len(families))]
    rows = check_tasks([str(d) for d in picked], jobs=2)
    bad = [f"{r.task}: oracle={r.oracle_reward} untouched={r.untouched_reward} fault={r.fault_reward} "
           f"fault+oracle={r.recovered_reward} {r.problem}" for r in rows if not r.ok]
    assert not bad, "\n".join(bad)
    assert len(rows) == len(FAMILIES) and all(r.recovery for r in rows)


def test_demonstrations_of_a_train_instance(docker_client, tmp_path):
    from reterm_jax.data.schema import validate_rows
    from reterm_jax.tasks.demos import build_demos
    (task,) = generate([FAMILIES["ini-retarget"]], "train", 1, seed=5, out=tmp_path / "train")
    out = tmp_path / "demos.jsonl"
    n = build_demos([str(task)], out, jobs=2)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert n == len(rows) == 6  # 3 fault kinds x (plain, inspect-first) recoveries
    good, report = validate_rows(rows)
    assert report.invalid == 0 and len({r["id"] for r in rows}) == 6
    inspect_first = 0
    for row in rows:
        assert row["verified_rewards"] == {"attempt_1": 0.0, "recovery": 1.0}
        commands = [json.loads(m["tool_calls"][0]["function"]["arguments"])["command"]
                    for m in row["messages"][row["train_from_message_index"]:] if m.get("tool_calls")]
        assert any("checkout -- app.ini" in c for c in commands), commands  # the oracle's restore
        inspect_first += commands[0] == "git -C /app/config status --short"  # the family's inspection
    assert inspect_first == 3
    faults = {json.loads(r["messages"][2]["tool_calls"][0]["function"]["arguments"])["command"] for r in rows}
    assert len(faults) == 3  # the three fault kinds, each run for real as attempt 1
    (held,) = generate([FAMILIES["ini-retarget"]], "heldout", 1, seed=5, out=tmp_path / "heldout")
    with pytest.raises(ValueError, match="not from a training split"):
        build_demos([str(held)], tmp_path / "no.jsonl")
    assert not (tmp_path / "no.jsonl").exists()
    (novel,) = generate([FAMILIES["ini-retarget"]], "novel", 1, seed=5, out=tmp_path / "novel")
    assert build_demos([str(novel)], tmp_path / "plain.jsonl", jobs=2, faults_per_task=1) == 2
    plain = [json.loads(line) for line in (tmp_path / "plain.jsonl").read_text().splitlines()]
    # with a first-attempt row: the oracle from the clean state, verified, trained on as attempt 1;
    # the recovery rows reused from the build without them, as they were
    assert build_demos([str(novel)], tmp_path / "novel.jsonl", jobs=2, faults_per_task=1, solve_rows=True,
                       reuse=tmp_path / "plain.jsonl") == 3
    rows = [json.loads(line) for line in (tmp_path / "novel.jsonl").read_text().splitlines()]
    assert rows[:2] == plain
    for wrong, match in ((out, "not one of the 1 given"), (tmp_path / "novel.jsonl", "first-attempt row already")):
        with pytest.raises(ValueError, match=match):  # before any sandbox starts
            build_demos([str(novel)], tmp_path / "no.jsonl", solve_rows=True, reuse=wrong)
    (solve,) = [r for r in rows if r["target_attempt_index"] == 1]
    assert solve["verified_rewards"] == {"attempt_1": 1.0} and solve["train_from_message_index"] == 2
    assert [m["role"] for m in solve["messages"][:3]] == ["system", "user", "assistant"]
    oracle = (novel / "solution/solve.sh").read_text()
    commands = [json.loads(m["tool_calls"][0]["function"]["arguments"])["command"]
                for m in solve["messages"] if m.get("tool_calls")]
    assert commands and all(c in oracle for c in commands)
    assert validate_rows([solve])[1].invalid == 0


def test_ini_retarget_reports_how_close_a_failed_state_came(docker_client, tmp_path):
    """A failed check writes reward 0 with a "partial" score (mostly the moved section's host,
    letter by letter): the fault and the committed file restored without the edit score lower
    than a fix with one wrong letter in a host, the oracle scores 1 with no partial. The reward
    the evaluation counts stays binary."""
    from reterm_jax.sandbox import DockerSandbox, load_task, run_oracle, verify
    (d,) = generate([FAMILIES["ini-retarget"]], "train", 1, seed=7, out=tmp_path)
    task = load_task(str(d))
    with DockerSandbox.from_task(task) as sb:
        for cmd in task.fault_commands:
            sb.exec(cmd)
        fault = verify(sb)
        assert fault.reward == 0.0 and not fault.resolved and fault.error is None
        assert 0.0 < fault.rewards["partial"] < 1.0, fault.rewards
        assert run_oracle(sb).exit_code == 0
        oracle = verify(sb)
        assert oracle.reward == 1.0 and oracle.rewards == {"reward": 1.0}
        # the oracle's file with one letter more in one host: nearly right, still 0
        sb.exec("sed -i '0,/^host = /s/^host = /host = X/' /app/config/app.ini")
        near = verify(sb)
        assert near.reward == 0.0 and not near.resolved
        assert fault.rewards["partial"] < near.rewards["partial"] < 1.0, (fault.rewards, near.rewards)
        # restoring the committed file without the edit undoes the fault, not the task: it scores low
        sb.exec("git -C /app/config checkout -- app.ini")
        restored = verify(sb)
        assert restored.reward == 0.0 and restored.rewards["partial"] < 0.5 < near.rewards["partial"], \
            (restored.rewards, near.rewards)
