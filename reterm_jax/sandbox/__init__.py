"""Docker sandboxes for Harbor-format terminal tasks (see docs/sandbox.md).

    from reterm_jax.sandbox import load_task, DockerSandbox, verify
    task = load_task("tasks/some_task")
    with DockerSandbox.from_task(task) as sb:
        r = sb.exec("ls", timeout=30)          # ExecResult(output, exit_code, ...)
        snap = sb.snapshot()
        branches = snap.branch(4)              # independent sandboxes from the snapshot
        result = verify(sb)                    # tests run on a clone; sb is untouched
"""
from reterm_jax.sandbox.check import CheckRow, check_task, check_tasks
from reterm_jax.sandbox.client import DockerUnavailable, SandboxError, get_client
from reterm_jax.sandbox.images import ensure_task_image, environment_hash
from reterm_jax.sandbox.pool import Outcome, SandboxPool
from reterm_jax.sandbox.reaper import ReapReport, reap
from reterm_jax.sandbox.sandbox import DockerSandbox, Limits
from reterm_jax.sandbox.shell import ExecResult
from reterm_jax.sandbox.snapshots import Snapshot, branch, live_snapshots
from reterm_jax.sandbox.task import Task, TaskError, load_task
from reterm_jax.sandbox.verify import VerifyResult, reduce_rewards, run_oracle, verify

__all__ = [
    "CheckRow", "DockerSandbox", "DockerUnavailable", "ExecResult", "Limits", "Outcome",
    "ReapReport", "SandboxError", "SandboxPool", "Snapshot", "Task", "TaskError",
    "VerifyResult", "branch", "check_task", "check_tasks", "ensure_task_image",
    "environment_hash", "get_client", "live_snapshots", "load_task", "reap", "reduce_rewards",
    "run_oracle", "verify",
]
