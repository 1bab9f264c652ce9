"""`python -m reterm_jax.sandbox check TASK_DIR...`: is each task solvable and not
already solved? The oracle (solution/solve.sh) must get reward 1 and the untouched
environment reward 0. Prints a table; the exit status says whether all tasks pass.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from reterm_jax.sandbox.client import SandboxError
from reterm_jax.sandbox.pool import SandboxPool
from reterm_jax.sandbox.sandbox import DockerSandbox
from reterm_jax.sandbox.task import TaskError, load_task
from reterm_jax.sandbox.verify import run_oracle, verify


@dataclasses.dataclass(frozen=True)
class CheckRow:
    task: str
    oracle_reward: float | None = None
    untouched_reward: float | None = None
    seconds: float = 0.0
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem and self.oracle_reward == 1.0 and self.untouched_reward == 0.0


def check_task(task_dir: str) -> CheckRow:
    start = time.monotonic()
    try:
        task = load_task(task_dir)
        with DockerSandbox.from_task(task) as untouched:
            empty = verify(untouched)
        with DockerSandbox.from_task(task) as sb:
            oracle_run = run_oracle(sb)
            oracle = verify(sb)
    except (TaskError, SandboxError) as e:
        return CheckRow(task=Path(task_dir).name, seconds=time.monotonic() - start, problem=str(e))
    problems = []
    if oracle_run.timed_out:
        problems.append(f"solve.sh: agent timeout ({task.agent_timeout_s:g} s, [agent].timeout_sec); "
                        f"its output's tail: {oracle_run.output[-300:]!r}")
    elif not oracle_run.ok or oracle_run.exit_code != 0:
        problems.append(f"solve.sh exit {oracle_run.exit_code}"
                        f"{': ' + oracle_run.error if oracle_run.error else ''}; "
                        f"tail: {oracle_run.output[-300:]!r}")
    for label, v in (("oracle", oracle), ("untouched", empty)):
        if v.error:
            # what test.sh printed says why it wrote no reward (a crash, a missing tool, a typo)
            said = f"; test.sh said: {v.output[-300:]!r}" if v.output.strip() else "; test.sh printed nothing"
            problems.append(f"{label} verify: {v.error}{said}")
    if oracle.reward != 1.0 and not oracle.error:
        problems.append(f"oracle reward {oracle.reward:g} != 1; tests said: {oracle.output[-300:]!r}")
    if empty.reward != 0.0 and not empty.error:
        problems.append(f"untouched environment already gets reward {empty.reward:g} (expected 0)")
    return CheckRow(task.name, oracle.reward, empty.reward, time.monotonic() - start,
                    "; ".join(problems))


def format_table(rows: list[CheckRow]) -> str:
    lines = ["| task | oracle | untouched | ok | seconds | problem |",
             "|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    for r in rows:
        problem = r.problem.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.task} | {fmt(r.oracle_reward)} | {fmt(r.untouched_reward)} | "
                     f"{'yes' if r.ok else 'NO'} | {r.seconds:.1f} | {problem} |")
    n_ok = sum(r.ok for r in rows)
    lines.append(f"\n{n_ok}/{len(rows)} tasks pass (oracle reward 1, untouched reward 0)")
    return "\n".join(lines)


def check_tasks(task_dirs: list[str], jobs: int = 2) -> list[CheckRow]:
    with SandboxPool(max_concurrency=jobs) as pool:
        outcomes = pool.map(check_task, task_dirs)
    return [o.value if o.ok else CheckRow(task=Path(o.item).name, problem=o.error) for o in outcomes]
