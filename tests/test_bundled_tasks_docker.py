"""The bundled task suite, end to end in real Docker.

Every task passes the `check` CLI's contract: the oracle earns reward 1 and the untouched
environment 0. Every recovery task also: its fault commands alone leave reward 0, and the
oracle run AFTER the fault still earns 1 (the state is damaged, but recoverably).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from reterm_jax.sandbox import check_tasks, load_task

pytestmark = pytest.mark.docker

TASKS = sorted(str(p.parent) for p in (Path(__file__).parent.parent / "tasks").glob("*/task.toml"))
RECOVERY = [t for t in TASKS if load_task(t).fault_commands]


def test_every_bundled_task_passes_check(docker_client):
    rows = check_tasks(TASKS, jobs=2)
    bad = [f"{r.task}: oracle={r.oracle_reward} untouched={r.untouched_reward} fault={r.fault_reward} "
           f"fault+oracle={r.recovered_reward} {r.problem}" for r in rows if not r.ok]
    assert len(rows) == len(TASKS) >= 24
    assert not bad, "\n".join(bad)
    recovery = {r.task for r in rows if r.recovery}
    assert recovery == {Path(t).name for t in RECOVERY} and len(recovery) >= 8
    assert all(r.fault_reward == 0.0 and r.recovered_reward == 1.0 for r in rows if r.recovery)
