"""Full episodes against Docker: a Recovery@k state (the task's fault commands as a failed first
attempt), G branches of its snapshot, the tiny model's rollouts, and verification on clones."""
from pathlib import Path

import jax
import pytest

from reterm_jax.data import load_tokenizer
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import bash_call_xml as xml_call
from reterm_jax.rl.agent.harness import Limits, format_observation, initial_messages
from reterm_jax.rl.agent.rollout import run_episodes
from reterm_jax.rl.inference.sampling import SamplingParams
from reterm_jax.sandbox import DockerSandbox, SandboxPool, load_task, verify
from rl_test_utils import tiny_sampler

pytestmark = pytest.mark.docker

TASK = Path(__file__).parent.parent / "tasks" / "daily-report-append"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def sampler(tok):
    return tiny_sampler(tok, max_length=3072)


@pytest.fixture(scope="module")
def failed_state(docker_client):
    """(task, snapshot after the failed attempt, its history). The snapshot is released at the end."""
    task = load_task(TASK)
    assert task.fault_commands
    history = initial_messages(task.instruction)
    with DockerSandbox.from_task(task) as sb:
        for i, command in enumerate(task.fault_commands):
            r = sb.exec(command, timeout=60)
            assert r.ok
            history.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": f"f{i}", "type": "function", "function": {"name": "bash", "arguments": {"command": command}}}]})
            history.append({"role": "tool", "content": format_observation(r.output, r.exit_code, r.timed_out)})
        history.append({"role": "assistant", "content": "The task is complete."})
        assert verify(sb).reward == 0.0  # the failed attempt really failed
        snap = sb.snapshot()
    yield task, snap, history
    snap.release()


def test_random_model_recovery_episodes_end_cleanly_with_rewards(failed_state, tok, sampler):
    task, snap, history = failed_state
    branches = snap.branch(2)
    try:
        messages = [initial_messages(task.instruction, history=history)] * 2
        with SandboxPool(max_concurrency=2) as pool:
            trajs = run_episodes(sampler, tok, branches, messages, task_ids=[task.name] * 2,
                                 limits=Limits.tiny(max_new_tokens_per_turn=48), params=SamplingParams(1.0),
                                 key=jax.random.key(0), pool=pool, verify_fn=verify)
    finally:
        for b in branches:
            b.close()
    for traj in trajs:
        assert traj.end_reason in harness.END_REASONS and traj.end_reason != harness.SANDBOX_ERROR
        assert traj.turns and traj.num_sampled > 0
        assert traj.reward == 0.0 and traj.verify_error is None and traj.error is None and not traj.resolved
        assert traj.train_from_message_index == len(messages[0])
        row = traj.to_reterm_row(target_attempt_index=2)
        assert row["messages"][:len(messages[0])] == messages[0]
        assert traj.to_harbor()["extra"]["reward"] == 0.0


def test_scripted_oracle_recovers_through_the_token_path(failed_state, tok, sampler):
    """The oracle's commands, teacher-forced as tool calls through the sampler, earn reward 1."""
    task, snap, history = failed_state
    solve = (task.solution_dir / "solve.sh").read_text()
    turns = ["Check the state left behind.\n</think>\n\n" + xml_call("cd /app && ls -la reports") + "<|im_end|>",
             "Rebuild the report.\n</think>\n\n" + xml_call(solve.strip()) + "<|im_end|>",
             "Rebuilt.\n</think>\n\nThe report is rebuilt from the logs; the task is complete.<|im_end|>"]
    (branch,) = snap.branch(1)
    try:
        (traj,) = run_episodes(sampler, tok, [branch], [initial_messages(task.instruction, history=history)],
                               task_ids=[task.name], limits=Limits.tiny(max_new_tokens_per_turn=512),
                               script=lambda r, t: turns[len(t.turns)], verify_fn=verify)
    finally:
        branch.close()
    assert traj.end_reason == harness.COMPLETED and len(traj.turns) == 3
    assert traj.turns[0].exit_codes == [0] and traj.turns[1].exit_codes == [0]
    assert traj.reward == 1.0 and traj.resolved and traj.verify_error is None


def test_an_attempt_that_outgrows_storage_mb_ends_as_disk_limit_with_reward_0(failed_state, tok, sampler):
    """storage_mb is enforced: a command that writes past it is stopped by the watchdog, the
    attempt ends as disk_limit (the agent's doing: reward 0, not a masked sandbox error) and the
    container is stopped; an attempt that stays under it is untouched."""
    import dataclasses

    from reterm_jax.sandbox.sandbox import Limits as SandboxLimits
    task, snap, history = failed_state
    turns = ["Make room.\n</think>\n\n" + xml_call("head -c 80000000 /dev/zero > /app/fill; echo written")
             + "<|im_end|>",
             "Done.\n</think>\n\nThe task is complete.<|im_end|>"]
    small = dataclasses.replace(SandboxLimits.from_task(task), storage_mb=32)
    roomy = dataclasses.replace(small, storage_mb=512)
    sandboxes = [DockerSandbox(snap.image_id, limits=lim, task=task) for lim in (small, roomy)]
    try:
        trajs = run_episodes(sampler, tok, sandboxes, [initial_messages(task.instruction, history=history)] * 2,
                             task_ids=[task.name] * 2, limits=Limits.tiny(max_new_tokens_per_turn=512),
                             script=lambda r, t: turns[len(t.turns)], verify_fn=verify)
        assert not sandboxes[0].alive() and sandboxes[1].alive()
    finally:
        for sb in sandboxes:
            sb.close()
    over, under = trajs
    assert over.end_reason == harness.DISK_LIMIT and over.reward == 0.0 and not over.resolved
    assert "storage_mb=32" in over.error and over.verify_error is None
    assert under.end_reason == harness.COMPLETED and under.turns[0].outputs == ["written\n"]
