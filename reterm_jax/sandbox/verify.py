"""Verification on a clone or in place, and the oracle solution.

verify(sb): commit the sandbox's current state, start a clone from it, copy tests/ to
/tests (replacing anything the agent put there), empty /logs/verifier (so an agent
cannot pre-write a reward), run `bash /tests/test.sh` from the image's working dir
with the image's environment (not the agent's cwd/env) under the verifier timeout,
read the reward, and throw the clone and the snapshot away. The sandbox the agent
continues from never sees the verifier's side effects.

verify(sb, in_place=True), for an attempt nothing continues from: the same tests in `sb`
itself, once every process the agent left is killed (in_place.py), so they see what a clone
would; `sb` is consumed.

Reward: /logs/verifier/reward.txt holds one float. reward.json holds {name: float};
it reduces to its "reward" key if present, else to the mean of its values. When both
exist, reward.txt wins. A timeout, a missing or unparseable reward file gives
reward 0 with the reason in `error` (the agent can cause these: a real 0). When the state cannot be
committed or cloned, or the clone dies, `error` says so and `infrastructure` is True: no reward
was measured. Resolved means reward >= 1.0.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time

from reterm_jax.sandbox.client import SandboxError
from reterm_jax.sandbox.in_place import ProcessesSurvived, end_processes
from reterm_jax.sandbox.sandbox import DockerSandbox, inline_put_script
from reterm_jax.sandbox.shell import ExecResult
from reterm_jax.sandbox.task import Task

log = logging.getLogger(__name__)
REWARD_DIR = "/logs/verifier"
_PREPARE = f"rm -rf /tests {REWARD_DIR} && mkdir -p {REWARD_DIR}"  # before tests/ is copied in
# A prelude travels in the shell server's argv (one argument: at most 128 KiB on Linux)
_PRELUDE_COPY_MAX_CHARS = 32 * 1024
_READ_REWARD = (f"for f in {REWARD_DIR}/reward.txt {REWARD_DIR}/reward.json; do "
                "if [ -f \"$f\" ]; then echo \"== $f\"; head -c 65536 \"$f\"; echo; fi; done")


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    reward: float
    rewards: dict[str, float]    # reward.json contents, or {"reward": x} from reward.txt
    output: str                  # verifier output (truncated head+tail)
    exit_code: int
    timed_out: bool
    duration_s: float
    error: str | None = None     # why the reward is 0 without the tests saying so
    # True: the error is the infrastructure's (the state could not be committed or cloned, the
    # clone died, the engine failed): no reward was measured, so training masks the attempt.
    # False with an error: the agent's doing (no or unparsable reward file, verifier timeout),
    # a real reward 0.
    infrastructure: bool = False

    @property
    def resolved(self) -> bool:
        return self.reward >= 1.0


def reduce_rewards(rewards: dict[str, float]) -> float:
    if "reward" in rewards:
        return float(rewards["reward"])
    return sum(rewards.values()) / len(rewards) if rewards else 0.0


def parse_reward_files(listing: str) -> tuple[dict[str, float], str | None]:
    """Parse the `== path` sections printed by _READ_REWARD -> (rewards, error)."""
    sections: dict[str, str] = {}
    current = None
    for line in listing.splitlines(keepends=True):
        if line.startswith(f"== {REWARD_DIR}/"):
            current = line[3:].strip().rsplit("/", 1)[1]
            sections[current] = ""
        elif current:
            sections[current] += line
    if "reward.txt" in sections:
        text = sections["reward.txt"].strip()
        try:
            value = float(text)
        except ValueError:
            return {}, f"reward.txt does not hold a float: {text[:80]!r}"
        if not math.isfinite(value):
            return {}, f"reward.txt holds {value}"
        return {"reward": value}, None
    if "reward.json" in sections:
        try:
            data = json.loads(sections["reward.json"])
        except json.JSONDecodeError as e:
            return {}, f"reward.json is not valid JSON: {e}"
        if (not isinstance(data, dict) or not data or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in data.values())):
            return {}, f"reward.json must map names to numbers, got {str(data)[:80]!r}"
        return {k: float(v) for k, v in data.items()}, None
    return {}, f"the verifier wrote neither {REWARD_DIR}/reward.txt nor reward.json"


def _failed(start: float, error: str, r: ExecResult | None = None) -> VerifyResult:
    """The verifier could not run (an infrastructure failure, see VerifyResult.infrastructure)."""
    return VerifyResult(0.0, {}, r.output if r else "", r.exit_code if r else -1,
                        bool(r and r.timed_out), time.monotonic() - start, error, infrastructure=True)


def verify(sandbox: DockerSandbox, task: Task | None = None, *,
           timeout_s: float | None = None, snapshot=None, in_place: bool = False) -> VerifyResult:
    """Run the task's tests on a clone of `sandbox`'s current state. Never raises for
    sandbox/Docker failures: they become reward 0 with `error` set.

    `snapshot`: that state already committed (e.g. `FailureBank.snapshot`, so the failure bank
    keeps the very image verified instead of committing the state a second time); the clone
    starts from it and the caller keeps ownership (nothing here releases it).

    `in_place`: the attempt is over for good (nothing continues from `sandbox`): end every process
    the agent left and run the tests in `sandbox` itself, which is consumed (in_place.py says what
    that keeps equal to a clone). Should the processes not all end, the state is verified on a
    clone as usual."""
    task = task or sandbox.task
    if task is None:
        raise ValueError("verify() needs the Task (the sandbox was not started from one)")
    timeout_s = timeout_s or task.verifier_timeout_s
    start = time.monotonic()
    if in_place:
        copy = _tests_copy_script(sandbox, task)
        try:
            end_processes(sandbox, then=_PREPARE + (f" &&\n{copy}" if copy else ""))
        except ProcessesSurvived as e:
            log.warning("%s; verifying on a clone instead", e)
        except SandboxError as e:
            return _failed(start, f"could not verify in place: {e}")
        else:
            return _run_tests(sandbox, task, timeout_s, start, prepared=True, tests_copied=copy is not None)
    try:
        snap = snapshot or sandbox.snapshot()
    except SandboxError as e:
        return _failed(start, f"could not snapshot the state to verify: {e}")
    try:
        with snap.branch(1)[0] as clone:
            return _run_tests(clone, task, timeout_s, start)
    except SandboxError as e:
        return _failed(start, f"verifier sandbox failed: {e}")
    finally:
        if snapshot is None:
            snap.release()


def _tests_copy_script(sandbox: DockerSandbox, task: Task) -> str | None:
    """The bash that writes tests/ to /tests, to run in the in-place verifier's prelude (no command
    of its own), where put_dir would write it inline anyway: commands run as root and the tree is
    small. None otherwise, or when the script would make the server's argv too long."""
    if not sandbox.runs_as_root:
        return None
    script = inline_put_script(task.tests_dir, "/tests")
    return script if script is not None and len(script) <= _PRELUDE_COPY_MAX_CHARS else None


def _run_tests(box: DockerSandbox, task: Task, timeout_s: float, start: float, *,
               prepared: bool = False, tests_copied: bool = False) -> VerifyResult:
    """tests/ over /tests, an empty reward dir, `bash /tests/test.sh` from the image's working
    dir and environment, and the reward files read back (verify's contract, in `box`).
    prepared: _PREPARE already ran (no /tests, an empty reward dir); tests_copied: and tests/ is
    in /tests (the prelude wrote it)."""
    if not tests_copied:
        try:
            box.put_dir(task.tests_dir, "/tests", replace=not prepared)
        except SandboxError as e:
            return _failed(start, f"verifier sandbox failed: {e}")
    if not prepared:
        prep = box.exec(f"rm -rf {REWARD_DIR} && mkdir -p {REWARD_DIR}", 60, persist=False)
        if not prep.ok or prep.exit_code:
            return _failed(start, f"could not prepare {REWARD_DIR}: {prep.error or prep.output}")
    r = box.exec("bash /tests/test.sh", timeout_s, persist=False)
    if not r.ok:
        return _failed(start, f"verifier sandbox failed: {r.error}", r)
    listing = box.exec(_READ_REWARD, 60, persist=False)
    rewards, error = parse_reward_files(listing.output if listing.ok else "")
    if r.timed_out:
        error = f"verifier timed out after {timeout_s:g} s" + (f" ({error})" if error else "")
        rewards = {}
    reward = reduce_rewards(rewards) if error is None else 0.0
    return VerifyResult(reward, rewards, r.output, r.exit_code, r.timed_out,
                        time.monotonic() - start, error)


def run_oracle(sandbox: DockerSandbox, task: Task | None = None) -> ExecResult:
    """Copy solution/ to /solution and run `bash /solution/solve.sh` through the
    ordinary (persistent) exec path, under the agent timeout."""
    task = task or sandbox.task
    if task is None:
        raise ValueError("run_oracle() needs the Task (the sandbox was not started from one)")
    try:
        sandbox.put_dir(task.solution_dir, "/solution")
    except SandboxError as e:
        return ExecResult("", -1, error=str(e))
    return sandbox.exec("bash /solution/solve.sh", task.agent_timeout_s)
