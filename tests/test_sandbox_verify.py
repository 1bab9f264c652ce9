"""verify() on a clone and the oracle, against the real Docker engine."""
import shutil

import pytest

from reterm_jax.sandbox import DockerSandbox, load_task, run_oracle, verify

pytestmark = pytest.mark.docker


@pytest.fixture
def greeting(docker_client, task_path):
    task = load_task(task_path("make_greeting"))
    with DockerSandbox.from_task(task) as sb:
        yield task, sb


def test_verify_leaves_no_trace_in_the_continuing_state(greeting):
    task, sb = greeting
    sb.exec("cd /tmp && export KEEP=me")
    assert verify(sb).reward == 0.0
    assert run_oracle(sb).exit_code == 0
    result = verify(sb)
    assert result.resolved and result.reward == 1.0 and result.error is None
    # The verifier touched /app/.verifier_was_here, wrote /logs/verifier, had /tests:
    # none of it is in the sandbox the agent continues from; cwd and env are intact.
    out = sb.exec("ls -a /app; ls /tests /logs/verifier 2>&1; pwd; echo $KEEP").output
    assert ".verifier_was_here" not in out and "reward" not in out
    assert "/tests': No such file" in out and out.endswith("/tmp\nme\n")
    assert sb.exec("cat /app/greeting.txt").output == "hello, sandbox\n"


def test_agent_cannot_pre_write_the_reward(greeting):
    task, sb = greeting
    sb.exec("mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
            "printf 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh")
    assert verify(sb).reward == 0.0


def test_fault_command_then_recovery(greeting):
    task, sb = greeting
    for cmd in task.fault_commands:
        sb.exec(cmd)
    assert verify(sb).reward == 0.0
    assert run_oracle(sb).exit_code == 0
    assert verify(sb).resolved


def test_reward_json_reduces_to_the_mean(docker_client, task_path):
    task = load_task(task_path("count_lines"))
    with DockerSandbox.from_task(task) as sb:
        sb.exec("echo 999 > /app/count.txt")
        partial = verify(sb)
        assert partial.rewards == {"exists": 1.0, "correct": 0.0} and partial.reward == 0.5
        assert not partial.resolved
        run_oracle(sb)
        assert verify(sb).reward == 1.0


def test_verifier_timeout_gives_zero_with_reason(docker_client, task_path):
    task = load_task(task_path("slow_verifier"))
    with DockerSandbox.from_task(task) as sb:
        r = verify(sb)
    assert r.reward == 0.0 and r.timed_out and "verifier timed out after 2 s" in r.error


def test_missing_reward_file_gives_zero_with_reason(docker_client, task_path, tmp_path):
    task_dir = tmp_path / "no_reward"
    shutil.copytree(task_path("count_lines"), task_dir)
    (task_dir / "tests/test.sh").write_text("#!/bin/bash\necho 'tests ran'\n")
    with DockerSandbox.from_task(load_task(task_dir)) as sb:
        r = verify(sb)
    assert r.reward == 0.0 and "wrote neither" in r.error and "tests ran" in r.output


def test_verify_on_a_dead_sandbox_is_a_failed_result(greeting, docker_client):
    task, sb = greeting
    docker_client.api.kill(sb.id)
    r = verify(sb)
    assert r.reward == 0.0 and "not running" in r.error
