"""`python -m reterm_jax.evaluate` and its protocols against real Docker sandboxes: the oracle's
Pass@1 on bundled tasks (through the CLI and its results JSON), a malformed task dir as a failed
row, fault_then_oracle under Recovery@2 (the attempt-2 state IS the damaged, unverified state)
and under Retry@2 (attempt 2 starts clean), and a tiny random model's smoke run."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reterm_jax.rl.evaluation import protocols as evaluation
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent import scripted
from reterm_jax.rl.evaluation import policies
from reterm_jax.sandbox import DockerSandbox, load_task, verify

pytestmark = pytest.mark.docker

REPO = Path(__file__).parent.parent
TASKS = REPO / "tasks"
# Recovery tasks and a file their fault command rewrites (the damage's fingerprint).
DAMAGED_FILE = {"daily-report-append": "/app/reports/daily.csv",
                "ini-config-retarget": "/app/deploy/config/app.ini"}


def run_cli(*args, timeout=240, returncode=0):
    r = subprocess.run([sys.executable, "-m", "reterm_jax.evaluate", *args], cwd=REPO, capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == returncode, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def fingerprint(sb, path):
    r = sb.exec(f"sha256sum {path} | cut -c1-64", timeout=30)
    assert r.ok and r.exit_code == 0, r.output
    return r.output.strip()


def test_oracle_pass_at_1_cli_and_malformed_task_row(docker_client, tmp_path):
    tasks = tmp_path / "tasks"
    for name in ("daily-report-append", "csv-region-totals"):
        shutil.copytree(TASKS / name, tasks / name)
    (tasks / "broken-task").mkdir()
    (tasks / "broken-task" / "task.toml").write_text("this is [not toml\n")
    out = tmp_path / "results.json"
    # a task that could not be evaluated: the results are still written, and the exit code says so
    r = run_cli("--config=configs/eval.py", f"--tasks={tasks}", "--config.policy=oracle",
                "--config.protocol.names=pass@1", "--config.jobs=2", f"--out={out}", returncode=1)
    assert "error: 1 of 3 tasks could not be evaluated: broken-task" in r.stderr
    res = json.loads(out.read_text())
    assert res["policy"] == "oracle"
    pass1 = res["summary"]["pass@1"]
    assert pass1["per_task"] == {"broken-task": 0.0, "csv-region-totals": 1.0, "daily-report-append": 1.0}
    assert pass1["errored_trials"] == 1
    rows = {t["task"]: t for t in res["trials"]}
    assert rows["broken-task"]["error"] and not rows["broken-task"]["attempts"]
    for name in ("daily-report-append", "csv-region-totals"):
        (a,) = rows[name]["attempts"]
        assert a["reward"] == 1.0 and a["resolved"] and a["end_reason"] == harness.COMPLETED
        assert a["turns"] > 1 and a["time_s"] > 0 and a["verify_error"] is None
    assert "broken-task" in r.stdout and "ERROR" in r.stdout and "daily-report-append" in r.stdout


class Probe:
    """fault_then_oracle, recording the damage fingerprint in the sandbox each attempt starts
    from (before the policy touches it), and whether the verifier's files leaked into it."""

    def __init__(self, path):
        self.path, self.start, self.histories, self.verifier_files = path, [], [], []

    def __call__(self, task, sb, history, index):
        self.start.append(fingerprint(sb, self.path))
        self.verifier_files.append(sb.exec("ls /logs/verifier 2>/dev/null | wc -l", timeout=30).output.strip())
        self.histories.append(history)
        return policies.fault_then_oracle(task, sb, history, index)


def clean_and_damaged(task, path):
    with DockerSandbox.from_task(task) as sb:
        clean = fingerprint(sb, path)
        for command in task.fault_commands:
            assert sb.exec(command, timeout=60).exit_code == 0
        return clean, fingerprint(sb, path)


@pytest.mark.parametrize("name", sorted(DAMAGED_FILE))
def test_fault_then_oracle_recovers_from_the_damaged_state(docker_client, name):
    task, path = load_task(TASKS / name), DAMAGED_FILE[name]
    clean, damaged = clean_and_damaged(task, path)
    assert clean != damaged  # the fault really changes the file

    probe = Probe(path)
    trial = evaluation.recovery_at_k(probe, task, k=2, sandbox_factory=DockerSandbox.from_task, verify_fn=verify)
    a1, a2 = trial.attempts
    assert a1.reward == 0.0 and not a1.resolved and a1.verify_error is None
    assert a2.reward == 1.0 and a2.resolved and trial.resolved
    # Attempt 2 starts from attempt 1's end state (the damage), not from a clean one...
    assert probe.start == [clean, damaged]
    # ...and from the UNVERIFIED state: the verifier ran on a clone and wrote nothing here.
    assert probe.verifier_files == ["0", "0"]
    # Memory is kept: the failed attempt's messages, then the retry turn is added by the policy.
    history = probe.histories[1]
    assert probe.histories[0] is None and history[1]["content"] == task.instruction
    assert history[-1] == {"role": "assistant", "content": scripted.DONE_CLAIM}
    assert [m["role"] for m in history].count("tool") == len(task.fault_commands)


def test_retry_at_2_resets_environment_and_memory(docker_client):
    name = "daily-report-append"
    task, path = load_task(TASKS / name), DAMAGED_FILE[name]
    probe = Probe(path)
    trial = evaluation.retry_at_k(probe, task, k=2, sandbox_factory=DockerSandbox.from_task, verify_fn=verify)
    a1, a2 = trial.attempts
    assert a1.reward == 0.0 and a2.resolved
    assert probe.start[0] == probe.start[1]  # attempt 2 starts from the clean state again
    assert probe.histories == [None, None]
    assert evaluation.summarize([trial], k=2)["retry@2"]["score"] == 1.0


def test_shared_first_attempt_branches_recovery_and_retry(docker_client):
    """One failed first attempt; recovery@2 continues its damaged state and history, retry@2
    starts a clean sandbox with no memory; pass@1 is that first attempt."""
    name = "daily-report-append"
    task, path = load_task(TASKS / name), DAMAGED_FILE[name]
    probe = Probe(path)
    calls = []  # how each attempt was verified: in place only when nothing continues its sandbox

    def verify_fn(sb, task, in_place=False):
        calls.append(in_place)
        return verify(sb, task, in_place=in_place)
    pass1, retry, recovery = evaluation.shared_first_attempt(probe, task, sandbox_factory=DockerSandbox.from_task,
                                                             verify_fn=verify_fn, sample=3)
    assert calls == [False, True, True]
    assert [t.protocol for t in (pass1, retry, recovery)] == list(evaluation.PROTOCOLS)
    assert pass1.attempts[0] is retry.attempts[0] is recovery.attempts[0] and not pass1.resolved
    assert len(pass1.attempts) == 1 and retry.resolved and recovery.resolved and retry.sample == 3
    # attempts: first (clean), recovery's second (damaged, with history), retry's second (clean, none)
    clean, damaged, again = probe.start
    assert clean == again != damaged
    assert probe.histories[0] is None and probe.histories[1] and probe.histories[2] is None
    s = evaluation.summarize([pass1, retry, recovery], k=2)
    assert (s["pass@1"]["score"], s["retry@2"]["score"], s["recovery@2"]["score"]) == (0.0, 1.0, 1.0)


def test_trial_keys_depend_on_the_trial_alone():
    import jax
    key = jax.random.key(7)
    k = policies.trial_key(key, "task-a", 1, 0)
    same = jax.random.key_data(policies.trial_key(key, "task-a", 1, 0))
    assert (jax.random.key_data(k) == same).all()
    others = [policies.trial_key(key, "task-b", 1, 0), policies.trial_key(key, "task-a", 2, 0),
              policies.trial_key(key, "task-a", 1, 1), policies.trial_key(key, "task-a", 1, 0, "retry")]
    assert all(not (jax.random.key_data(o) == same).all() for o in others)


def test_recovery_attempt_messages_open_with_the_retry_turn(docker_client):
    task = load_task(TASKS / "ini-config-retarget")
    with DockerSandbox.from_task(task) as sb:
        first = policies.fault_then_oracle(task, sb, None, 0)
        second = policies.fault_then_oracle(task, sb, first.messages, 1)
    n = len(first.messages)
    assert second.messages[:n] == first.messages
    assert second.messages[n] == {"role": "user", "content": harness.RETRY_PROMPT}
    assert second.messages[-1]["content"] == scripted.DONE_CLAIM and second.end_reason == harness.COMPLETED


def test_model_policy_smoke_cli(docker_client, tmp_path):
    out = tmp_path / "results.json"
    run_cli("--config=configs/eval.py", f"--tasks={TASKS / 'daily-report-append'}", "--config.policy=model",
            "--config.protocol.names=pass@1", "--config.limits.max_turns=1",
            "--config.limits.max_new_tokens_per_turn=16", "--config.limits.max_tokens=3500",
            "--config.model.max_length=4096", f"--out={out}", timeout=400)
    res = json.loads(out.read_text())
    (trial,) = res["trials"]
    assert trial["error"] is None
    (a,) = trial["attempts"]
    assert a["end_reason"] in harness.END_REASONS and a["end_reason"] != harness.SANDBOX_ERROR
    assert a["tokens"] > 0 and a["context_tokens"] > a["tokens"] and a["turns"] == 1
    assert a["reward"] == 0.0 and not a["resolved"] and a["verify_error"] is None
    assert res["summary"]["pass@1"]["score"] == 0.0


def test_model_recovery_attempts_continue_the_exact_tokens(docker_client):
    """Recovery@2 with the model: attempt 2 continues attempt 1's exact tokens + the retry turn
    (as GRPO's recovery groups do), not a re-render of its messages (which would drop <think>)."""
    import sys as _sys
    _sys.path.insert(0, str(REPO / "configs"))
    import eval as eval_config

    from reterm_jax.evaluate import build_model_policy
    from reterm_jax.rl.agent.turns import continuation_prompt
    c = eval_config.get_config("tiny")
    c.policy = "model"
    c.limits.max_turns, c.limits.max_new_tokens_per_turn, c.limits.max_tokens = 1, 12, 3800
    c.model.max_length = 4096
    model = build_model_policy(c)
    calls = []

    def policy(task, sandbox, history, index, context=None):
        res = model(task, sandbox, history, index, context=context)
        calls.append((context, res))
        return res

    task = load_task(TASKS / "daily-report-append")
    trial = evaluation.recovery_at_k(policy, task, k=2, sandbox_factory=DockerSandbox.from_task, verify_fn=verify)
    assert len(trial.attempts) == 2 and len(calls) == 2
    (ctx1, first), (ctx2, second) = calls
    assert ctx1 is None and ctx2 == first.context
    prompt = continuation_prompt(model.tokenizer, first.context)
    assert second.context[:len(prompt)] == prompt and len(second.context) > len(prompt)


def test_model_policy_on_shared_slots_samples_the_same_attempts(docker_client):
    """slots=2 (concurrent attempts decode together on one SlotEngine) gives the same attempts as
    slots=0 (one at a time, lockstep): the per-trial key decides the tokens, not the schedule."""
    import sys as _sys
    from concurrent.futures import ThreadPoolExecutor
    _sys.path.insert(0, str(REPO / "configs"))
    import eval as eval_config

    from reterm_jax.evaluate import build_model_policy
    c = eval_config.get_config("tiny")
    c.policy = "model"
    c.limits.max_turns, c.limits.max_new_tokens_per_turn, c.limits.max_tokens = 2, 24, 3800
    c.model.max_length = 4096
    task = load_task(TASKS / "daily-report-append")
    contexts = {}
    for slots in (0, 2):
        c.slots = slots
        policy = build_model_policy(c)

        def attempt(sample):
            sb = DockerSandbox.from_task(task)
            try:
                return policy(task, sb, [], 0, sample=sample).context
            finally:
                sb.close()
        try:
            with ThreadPoolExecutor(2) as ex:
                contexts[slots] = list(ex.map(attempt, [0, 1]))
        finally:
            policy.close()
    assert contexts[0] == contexts[2] and contexts[0][0] != contexts[0][1]


def test_compare_pairs_two_runs_over_their_common_tasks():
    this = {"recovery@2": {"score": 0.5, "per_task": {"a": 1.0, "b": 0.0, "c": 0.5}},
            "pass@1": {"score": 0.0, "per_task": {"a": 0.0}}}
    base = {"recovery@2": {"score": 0.0, "per_task": {"a": 0.0, "b": 0.0}}}
    lines = evaluation.format_comparison(this, base).splitlines()
    assert len(lines) == 2 and lines[1].split()[:4] == ["recovery@2", "0.000", "0.500", "+0.500"]
    assert lines[1].split()[-1] == "2"  # task c is not in the baseline: left out of the pairing


def test_paired_difference_bootstraps_over_tasks():
    same = evaluation.paired_difference({"a": 0.75, "b": 0.25}, {"a": 0.5, "b": 0.0})
    assert same["mean"] == pytest.approx(0.25) and same["ci95"] == pytest.approx([0.25, 0.25])
    # one task of three improved by 1: the exact bootstrap of the mean puts 1/27 mass on 1 and
    # 8/27 on 0, so the 95% interval is [0, 1]
    r = evaluation.paired_difference({"a": 1.0, "b": 0.0, "c": 0.0}, {"a": 0.0, "b": 0.0, "c": 0.0}, seed=1)
    assert r["mean"] == pytest.approx(1 / 3) and r["ci95"] == pytest.approx([0.0, 1.0])
    assert (r["tasks"], r["improved"], r["worse"]) == (3, 1, 0)
    with pytest.raises(ValueError, match="same tasks"):
        evaluation.paired_difference({"a": 1.0}, {"b": 1.0})
