"""The sandbox under gVisor (`--config.sandbox.runtime=runsc`), against the real engine.

Runs where runsc is registered with the engine and starts a container (`RETERM_RUNSC=try bash
launch/setup.sh`, which launch/test.sh does, registers it); elsewhere the tests skip and say why.
The contract is the runc sandbox's: the user-space kernel is really there, commands keep their
cwd and exported variables, a snapshot and its branches hold /tmp and /app as the agent left them,
a bundled task's oracle scores 1 and its untouched environment 0, and storage_mb is enforced.
Where runsc is registered but cannot run the basic tools (`runtime_problem`: Debian bookworm's
gVisor 0.0~20221219 fails `ls` with "Invalid argument" on these machines), the contract tests skip
with that reason and the selection test checks the refusal."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reterm_jax.sandbox import DockerSandbox, SandboxError, load_task
from reterm_jax.sandbox.sandbox import Limits, runtime_problem, use_runtime

pytestmark = pytest.mark.docker
REPO = Path(__file__).parent.parent
BASE = os.environ.get("RETERM_BASE_IMAGE", "reterm/base:bookworm")


@pytest.fixture(scope="module")
def runsc(docker_client):
    if "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("runsc is not registered with the engine (RETERM_RUNSC=1 bash launch/setup.sh registers it)")
    problem = runtime_problem("runsc", BASE)
    if problem:  # e.g. Debian bookworm's gVisor on these machines: `ls` fails (statx)
        pytest.skip(problem)
    return Limits(runtime="runsc")


def test_selecting_runsc_works_or_says_why_in_one_line(docker_client):
    """use_runtime("runsc") either selects a runtime that runs the basic tools, or refuses with the
    reason (not registered; cannot start; `ls` fails) before any sandbox starts."""
    registered = "runsc" in (docker_client.info().get("Runtimes") or {})
    try:
        use_runtime("runsc")
    except SandboxError as e:
        text = str(e)
        assert "\n" not in text and ("not registered" in text if not registered else "cannot" in text), text
        return
    finally:
        os.environ.pop("RETERM_SANDBOX_RUNTIME", None)
    with DockerSandbox(BASE, limits=Limits(runtime="runsc")) as sb:
        assert sb.exec("ls / >/dev/null && echo ok").output == "ok\n"


def test_a_gvisor_sandbox_keeps_the_contract_through_snapshots(runsc):
    with DockerSandbox(BASE, limits=runsc) as sb:
        assert sb._container.attrs["HostConfig"]["Runtime"] == "runsc"
        kernel = sb.exec("dmesg 2>/dev/null | head -1").output
        assert "gVisor" in kernel, kernel  # the user-space kernel, not the host's
        assert sb.exec("mkdir -p /app/w && cd /app/w && echo a > f && echo t > /tmp/t && export MODE=x").ok
        r = sb.exec("pwd; echo $MODE; cat f /tmp/t")
        assert r.output == "/app/w\nx\na\nt\n"
        snap = sb.snapshot()
    try:
        branches = snap.branch(2)
        try:
            for b in branches:
                assert b.exec("pwd; echo $MODE; cat f /tmp/t").output == "/app/w\nx\na\nt\n"
            branches[0].exec("echo changed > f")
            assert branches[1].exec("cat f").output == "a\n"  # independent
        finally:
            for b in branches:
                b.close()
    finally:
        snap.release()


def test_a_bundled_task_checks_under_gvisor(runsc):
    proc = subprocess.run([sys.executable, "-m", "reterm_jax.sandbox", "check", "--runtime=runsc",
                           str(REPO / "tasks" / "daily-report-append")], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1/1 tasks pass" in proc.stdout


def test_storage_mb_is_enforced_under_gvisor(runsc):
    import dataclasses
    with DockerSandbox(BASE, limits=dataclasses.replace(runsc, storage_mb=32)) as sb:
        r = sb.exec("head -c 80000000 /dev/zero > /root/fill; echo done", 60)
        assert r.disk_limit and "storage_mb=32" in r.error and not sb.alive()


def test_an_unknown_runtime_is_refused_with_the_fix(docker_client):
    with pytest.raises(SandboxError, match="use one of runc, runsc"):
        use_runtime("kata")
    task = load_task(REPO / "tasks" / "daily-report-append")
    assert Limits.from_task(task).runtime in ("", "runsc")  # $RETERM_SANDBOX_RUNTIME, or the engine's default
