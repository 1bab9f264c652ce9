"""`python -m reterm_jax.sandbox check TASK_DIR...`: is each task solvable and not
already solved? The oracle (solution/solve.sh) must get reward 1 and the untouched
environment reward 0. A recovery task (`[reterm] fault_commands`) must also be damaged by
its fault, reward 0, and recoverable: the oracle run after the fault gets reward 1.
Prints a table; the exit status says whether all tasks pass.
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
    fault_reward: float | None = None      # recovery tasks: after the fault commands alone
    recovered_reward: float | None = None  # recovery tasks: after the fault, then the oracle
    recovery: bool = False

    @property
    def ok(self) -> bool:
        recovered = not self.recovery or (self.fault_reward == 0.0 and self.recovered_reward == 1.0)
        return (not self.problem and self.oracle_reward == 1.0 and self.untouched_reward == 0.0
                and recovered)


def check_task(task_dir: str) -> CheckRow:
    start = time.monotonic()
    try:
        task = load_task(task_dir)
        fault = recovered = None
        problems = []
        with DockerSandbox.from_task(task) as untouched:
            # verify runs on a clone, so the same sandbox then takes the fault and the oracle
            empty = verify(untouched)
            if task.fault_commands:
                fault, recovered = _fault_then_oracle(task, untouched, problems)
        with DockerSandbox.from_task(task) as sb:
            oracle_run = run_oracle(sb)
            oracle = verify(sb)
    except (TaskError, SandboxError) as e:
        return CheckRow(task=Path(task_dir).name, seconds=time.monotonic() - start, problem=str(e))
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
                    "; ".join(problems), fault_reward=fault, recovered_reward=recovered,
                    recovery=bool(task.fault_commands))


def _fault_then_oracle(task, sb, problems: list[str]) -> tuple[float | None, float | None]:
    """Run the fault commands, verify, run the oracle, verify: (fault reward, recovered reward)."""
    for cmd in task.fault_commands:
        res = sb.exec(cmd, timeout=120)
        if res.error is not None:
            problems.append(f"fault command {cmd[:60]!r} died: {res.error}")
            return None, None
    after_fault = verify(sb)
    if after_fault.reward != 0.0:
        problems.append(f"the fault alone already earns reward {after_fault.reward:g}")
    oracle_run = run_oracle(sb)
    after_oracle = verify(sb)
    if after_oracle.reward != 1.0:
        problems.append(f"fault then oracle earns {after_oracle.reward:g} (solve.sh exit "
                        f"{oracle_run.exit_code}, tail {oracle_run.output[-200:]!r}; tests said "
                        f"{after_oracle.output[-200:]!r})")
    return after_fault.reward, after_oracle.reward


def format_table(rows: list[CheckRow]) -> str:
    lines = ["| task | oracle | untouched | fault | fault+oracle | ok | seconds | problem |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    for r in rows:
        problem = r.problem.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.task} | {fmt(r.oracle_reward)} | {fmt(r.untouched_reward)} | "
                     f"{fmt(r.fault_reward)} | {fmt(r.recovered_reward)} | "
                     f"{'yes' if r.ok else 'NO'} | {r.seconds:.1f} | {problem} |")
    n_ok = sum(r.ok for r in rows)
    lines.append(f"\n{n_ok}/{len(rows)} tasks pass (oracle reward 1, untouched reward 0; recovery tasks: "
                 "fault alone 0, fault then oracle 1)")
    return "\n".join(lines)


def check_tasks(task_dirs: list[str], jobs: int = 2) -> list[CheckRow]:
    with SandboxPool(max_concurrency=jobs) as pool:
        outcomes = pool.map(check_task, task_dirs)
    return [o.value if o.ok else CheckRow(task=Path(o.item).name, problem=o.error) for o in outcomes]
