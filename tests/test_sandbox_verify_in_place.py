"""verify(in_place=True): the tests run in the attempt's own container once every process the agent
left is gone, and give what a clone gives, against the real Docker engine."""
import hashlib
import shutil

import pytest

from reterm_jax.sandbox import DockerSandbox, load_task, run_oracle, verify
from reterm_jax.sandbox import in_place
from reterm_jax.sandbox.client import SandboxError

pytestmark = pytest.mark.docker

# A background job that keeps claiming the reward: on a clone it does not exist (a commit keeps no
# process); in place it must be killed before the tests run, or it would write reward 1.
REWARD_HACK = ("nohup bash -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
               "sleep 0.01; done' >/dev/null 2>&1 &")
# A job that keeps forking: one sweep cannot catch every child, repeated sweeps must.
FORKER = "nohup bash -c 'while :; do sleep 30 & sleep 0.005; done' >/dev/null 2>&1 &"


@pytest.fixture
def greeting(docker_client, task_path):
    task = load_task(task_path("make_greeting"))
    with DockerSandbox.from_task(task) as sb:
        yield task, sb


def _processes(sb) -> list[str]:
    """The container's processes (pid, ppid, command), read as root outside the agent's shell."""
    code, out = sb._container.exec_run(["bash", "-c", "for d in /proc/[0-9]*; do echo $(cat $d/cmdline | tr '\\0' ' '); done"],
                                       user="root")
    assert code == 0
    # the verifier's own shell server (its prelude, the sweep, may hold tests/ with their reward.txt)
    return [line for line in out.decode().splitlines() if line.strip() and "reterm_sweep" not in line]


def test_in_place_gives_the_clones_rewards(docker_client, task_path):
    task = load_task(task_path("make_greeting"))
    results = {}
    for mode in (False, True):
        with DockerSandbox.from_task(task) as untouched, DockerSandbox.from_task(task) as solved:
            assert run_oracle(solved).exit_code == 0
            results[mode] = (verify(untouched, in_place=mode), verify(solved, in_place=mode))
    for clone, here in zip(results[False], results[True]):
        assert (here.reward, here.error, here.infrastructure) == (clone.reward, clone.error, clone.infrastructure)
    assert [r.reward for r in results[True]] == [0.0, 1.0]


def test_a_root_sandbox_gets_its_tests_in_the_verifiers_prelude(docker_client, task_path, monkeypatch):
    """Root, small tests/: the copy is part of the one exec that sweeps and starts the verifier
    (no put_dir); a tree too long for the prelude goes through put_dir. Same rewards either way."""
    import importlib
    verify_mod = importlib.import_module("reterm_jax.sandbox.verify")
    task = load_task(task_path("make_greeting"))
    puts = []
    real_put = DockerSandbox.put_dir
    monkeypatch.setattr(DockerSandbox, "put_dir", lambda self, *a, **kw: (puts.append(a[1]), real_put(self, *a, **kw)))
    for limit, expected_puts in ((verify_mod._PRELUDE_COPY_MAX_CHARS, []), (0, ["/tests", "/tests"])):
        monkeypatch.setattr(verify_mod, "_PRELUDE_COPY_MAX_CHARS", limit)
        with DockerSandbox.from_task(task) as untouched, DockerSandbox.from_task(task) as solved:
            assert untouched.runs_as_root
            assert run_oracle(solved).exit_code == 0
            puts.clear()  # the oracle's solution/ copy
            solved.exec("mkdir -p /tests && echo stale > /tests/test_outputs.py")  # replaced, not merged
            rewards = [verify(sb, in_place=True) for sb in (untouched, solved)]
            assert [(r.reward, r.infrastructure) for r in rewards] == [(0.0, False), (1.0, False)], rewards
            assert puts == expected_puts
            listing = solved.exec("cd /tests && find . -type f | sort | xargs md5sum", persist=False).output
        local = sorted((hashlib.md5(p.read_bytes()).hexdigest(), p.relative_to(task.tests_dir).as_posix())
                       for p in task.tests_dir.rglob("*") if p.is_file())
        assert sorted((h, name[2:]) for h, name in (line.split() for line in listing.splitlines())) == local


def test_background_jobs_are_killed_before_the_tests(greeting):
    task, sb = greeting
    assert run_oracle(sb).exit_code == 0
    sb.exec("rm /app/greeting.txt")  # now the tests fail, whatever a leftover job writes
    sb.exec(REWARD_HACK)
    sb.exec(FORKER)
    assert any("sleep 30" in p for p in _processes(sb))
    r = verify(sb, in_place=True)
    assert r.reward == 0.0 and not r.infrastructure, r
    left = _processes(sb)
    assert not any("sleep 30" in p or "reward.txt" in p for p in left), left
    assert any(p.startswith("sleep infinity") for p in left)  # the container's main process lives on


def test_side_by_side_verifications_all_run_in_place(docker_client, task_path):
    """Under load (a GRPO group verifies its G attempts at once), the killed processes take a while
    to exit; the sweep waits for them instead of giving up and verifying on a clone."""
    from concurrent.futures import ThreadPoolExecutor
    task = load_task(task_path("make_greeting"))
    sandboxes = [DockerSandbox.from_task(task) for _ in range(3)]
    try:
        for sb in sandboxes:
            sb.exec(FORKER)
            sb.exec(REWARD_HACK)
        with ThreadPoolExecutor(3) as ex:
            results = list(ex.map(lambda sb: verify(sb, in_place=True), sandboxes))
        assert [r.reward for r in results] == [0.0] * 3
        assert all("verified in place" in (sb.exec("true").error or "") for sb in sandboxes)  # none fell back
    finally:
        for sb in sandboxes:
            sb.close()


def test_a_sandbox_verified_in_place_is_consumed(greeting):
    task, sb = greeting
    sb.exec("cd /tmp && export KEEP=me")
    assert verify(sb, in_place=True).reward == 0.0
    after = sb.exec("echo hi")
    assert not after.ok and "verified in place" in after.error
    with pytest.raises(SandboxError, match="verified in place"):
        sb.snapshot()
    assert sb.exec("cat /logs/verifier/reward.txt", persist=False).ok  # the verifier's commands still run


def test_falls_back_to_a_clone_when_processes_survive(greeting, monkeypatch):
    task, sb = greeting
    monkeypatch.setattr(in_place, "SWEEP", "echo 'a process survived'; exit 3")
    assert run_oracle(sb).exit_code == 0
    r = verify(sb, in_place=True)
    assert r.resolved and r.error is None
    assert sb.exec("cat /app/greeting.txt").output == "hello, sandbox\n"  # not consumed: verified on a clone
    assert sb.exec("ls /tests 2>&1").exit_code != 0


def test_in_place_on_a_dead_sandbox_is_a_failed_result(greeting, docker_client):
    task, sb = greeting
    docker_client.api.kill(sb.id)
    r = verify(sb, in_place=True)
    assert r.reward == 0.0 and r.infrastructure and r.error


def test_an_image_with_another_user_is_swept_and_verified_as_its_user(docker_client, task_path, tmp_path):
    """Not root: the sweep runs as the image's user (a root exec would get no capabilities there),
    whose processes are all the container's, and the tests run as that user, as on a clone."""
    task_dir = tmp_path / "as_agent"
    shutil.copytree(task_path("make_greeting"), task_dir)
    with open(task_dir / "environment" / "Dockerfile", "a") as f:
        f.write("RUN useradd -m agent && mkdir -p /logs && chown agent /app /logs\nUSER agent\n")
    task = load_task(task_dir)
    with DockerSandbox.from_task(task) as sb, DockerSandbox.from_task(task) as other:
        assert sb.exec("whoami").output == "agent\n"
        assert not sb.runs_as_root and sb.exec("getent hosts localhost").output.split()[1:2] == ["localhost"]
        assert run_oracle(sb).exit_code == 0 and run_oracle(other).exit_code == 0
        sb.exec("rm /app/greeting.txt")
        sb.exec(REWARD_HACK)
        r = verify(sb, in_place=True)
        assert r.reward == 0.0 and not r.infrastructure, r
        assert not any("reward.txt" in p for p in _processes(sb))
        assert sb.exec("stat -c %U /logs/verifier/reward.txt", persist=False).output == "agent\n"
        assert verify(other, in_place=True).resolved


def test_a_prelude_whose_stream_breaks_is_not_reported_as_a_failing_sweep(greeting, monkeypatch):
    """A stream that ends before the prelude reports, with no failing status (here: the server's
    ready wait times out while the prelude still runs), is a broken connection, not a sweep
    that "ended with status 0"; nothing is consumed."""
    import functools

    from reterm_jax.sandbox import sandbox as sandbox_module
    _, sb = greeting
    monkeypatch.setattr(sandbox_module, "ShellSession",
                        functools.partial(sandbox_module.ShellSession, ready_timeout_s=1.0))
    with pytest.raises(SandboxError, match="connection to its new shell server broke before the prelude reported"):
        sb.consume("test", prelude="sleep 8")
    monkeypatch.undo()
    assert sb.exec("echo still-here").output.strip() == "still-here"  # not consumed
    assert sb.consume("test", prelude="exit 3") == 3  # a prelude that fails still gives its status
