"""The bundled task suite, end to end in real Docker.

Every task: the oracle earns reward 1 and the untouched environment 0 (the `check` CLI's
contract). Every recovery task: its fault commands alone leave reward 0, and the oracle
run AFTER the fault still earns 1 — the state is damaged, but recoverably.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from reterm_jax.sandbox import DockerSandbox, SandboxPool, check_tasks, load_task, run_oracle, verify

pytestmark = pytest.mark.docker

TASKS = sorted(str(p.parent) for p in (Path(__file__).parent.parent / "tasks").glob("*/task.toml"))
RECOVERY = [t for t in TASKS if load_task(t).fault_commands]


def test_every_bundled_task_passes_check(docker_client):
    rows = check_tasks(TASKS, jobs=2)
    bad = [f"{r.task}: oracle={r.oracle_reward} untouched={r.untouched_reward} {r.problem}"
           for r in rows if not r.ok]
    assert len(rows) == len(TASKS) >= 24
    assert not bad, "\n".join(bad)


def _fault_then_oracle(task_dir: str) -> tuple[float, float, str]:
    task = load_task(task_dir)
    with DockerSandbox.from_task(task) as sb:
        for cmd in task.fault_commands:
            res = sb.exec(cmd, timeout=120)
            assert res.error is None, f"{task.name}: fault command died: {res.error}"
        after_fault = verify(sb)
        oracle = run_oracle(sb)
        after_oracle = verify(sb)
    return after_fault.reward, after_oracle.reward, oracle.output[-300:]


def test_recovery_tasks_are_damaged_by_their_fault_and_recoverable(docker_client):
    assert len(RECOVERY) >= 8
    with SandboxPool(max_concurrency=2) as pool:
        outcomes = pool.map(_fault_then_oracle, RECOVERY)
    bad = []
    for o in outcomes:
        name = Path(o.item).name
        if not o.ok:
            bad.append(f"{name}: {o.error}")
            continue
        fault_reward, recovered_reward, tail = o.value
        if fault_reward != 0.0:
            bad.append(f"{name}: the fault alone already earns {fault_reward}")
        if recovered_reward != 1.0:
            bad.append(f"{name}: fault + oracle earns {recovered_reward}; oracle tail {tail!r}")
    assert not bad, "\n".join(bad)
