"""RecoveryProducer against real Docker and a real FailureBank: a scripted failing policy fills
the bank, G=2 recovery attempts branch from the failure with verified rewards and the right
masks, and a sandbox killed mid-episode becomes a masked member."""
import jax
import numpy as np
import pytest

from reterm_jax.data import load_tokenizer, special_ids
from reterm_jax.rl.agent import harness
from reterm_jax.rl.grpo.failure_bank import FailureBank
from reterm_jax.rl.agent.harness import Limits, bash_call_xml
from reterm_jax.rl.inference.policy_store import PolicyStore
from reterm_jax.rl.grpo.stream import GroupStream, StreamConfig, assess
from reterm_jax.rl.grpo.recovery import RecoveryConfig, RecoveryProducer
from reterm_jax.rl.grpo.workers import RolloutWorkers
from reterm_jax.sandbox import labels, load_task
from rl_test_utils import tiny_sampler

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FAILED = ["Write it.\n</think>\n\n" + bash_call_xml("echo 'hello sandbox' > /app/greeting.txt") + "<|im_end|>",
          "Written.\n</think>\n\nThe task is complete.<|im_end|>"]
FIX = ["Check it.\n</think>\n\n" + bash_call_xml("cat /app/greeting.txt") + "<|im_end|>",
       "Fix the comma.\n</think>\n\n" + bash_call_xml("echo 'hello, sandbox' > /app/greeting.txt") + "<|im_end|>",
       "Fixed.\n</think>\n\nThe greeting is corrected; the task is complete.<|im_end|>"]
GIVE_UP = ["Looks fine.\n</think>\n\nThe task is complete.<|im_end|>"]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def sampler(tok):
    return tiny_sampler(tok, max_length=2048)


@pytest.fixture
def bank(tmp_path, docker_client):
    b = FailureBank(tmp_path / "bank")
    yield b
    b.destroy()  # images included


def make_producer(bank, task, sampler, tok, script, engine="lockstep", verify="in_place"):
    cfg = RecoveryConfig(group_size=2, limits=Limits.tiny(max_new_tokens_per_turn=160, max_tokens=2048),
                         min_failures=1, collect_batch=1, engine=engine, decode_burst=16, verify=verify)
    return RecoveryProducer(bank, [task], sampler, tok, cfg, script=script,
                            collect_script=lambda r, t: FAILED[len(t.turns)])


@pytest.mark.parametrize("engine,verify", [("lockstep", "clone"), ("lockstep", "in_place"),
                                           ("continuous", "in_place")])
def test_recovery_groups_from_a_bank_filled_by_a_failing_policy(bank, task_path, sampler, tok, engine, verify,
                                                                 monkeypatch):
    import reterm_jax.rl.grpo.failure_bank as fb
    import reterm_jax.sandbox.snapshots as snapshots
    commits = []  # the real docker commits, counted by kind

    def counting_commit(sb, image_labels, **kw):
        commits.append(image_labels[labels.KIND])
        return snapshots.commit_image(sb, image_labels, **kw)
    monkeypatch.setattr(fb, "commit_image", counting_commit)
    monkeypatch.setattr(snapshots, "take_snapshot", lambda sb: snapshots.Snapshot(counting_commit(
        sb, labels.labels(labels.KIND_SNAPSHOT)), sb))
    task = load_task(task_path("make_greeting"))
    producer = make_producer(bank, task, sampler, tok,
                             script=lambda r, t: (FIX if r == 0 else GIVE_UP)[len(t.turns)], engine=engine,
                             verify=verify)
    group = producer.produce(3, None, jax.random.key(0))
    # the fresh failure was committed once, as the bank's image (issue 10 1.9); on a clone, the G=2
    # recovery attempts were each verified on a snapshot of their own, in place on none
    clones = 2 if verify == "clone" else 0
    assert sorted(commits) == [labels.KIND_BANK] + [labels.KIND_SNAPSHOT] * clones, commits
    # the collection round banked the scripted failure, stamped with the policy version
    assert len(bank) == 1 and producer.stats.failures_added == 1 and producer.stats.fresh_resolved == 0
    entry = bank.get(bank.entry_ids()[0])
    assert entry.policy_version == 3 and entry.reward == 0.0 and entry.tokens[-1] == special_ids(tok).im_end
    # one group of G=2 recovery attempts from that failure, verified
    assert group.failure_id == entry.entry_id and group.policy_version == 3 and group.task_id == task.name
    assert group.valid == [True, True] and group.rewards == [1.0, 0.0] and group.resolved == [True, False]
    assert group.sandbox_errors == 0 and producer.current_sandboxes == []
    retry = tok(harness.retry_turn_text(), add_special_tokens=False)["input_ids"]
    prompt = entry.tokens + retry
    for traj, turns in zip(group.trajectories, (FIX, GIVE_UP)):
        assert traj.tokens[:len(prompt)] == prompt and traj.prompt_len == len(prompt)
        mask = np.array(traj.loss_mask, bool)
        assert not mask[:len(prompt)].any()  # the failed attempt and the retry turn never train
        assert tok.decode(np.array(traj.tokens)[mask].tolist(), skip_special_tokens=False) == "".join(turns)
        assert traj.messages[len(entry.messages)] == {"role": "user", "content": harness.RETRY_PROMPT}
    assert assess(group, 3, StreamConfig(groups_per_step=1, group_size=2, seq_len=2048, pad_id=0)).usable


@pytest.mark.parametrize("kill_at_turn", [1, 2], ids=["mid_episode", "after_the_last_command"])
def test_a_killed_sandbox_is_a_masked_member_named_in_a_warning(bank, task_path, sampler, tok, docker_client,
                                                                kill_at_turn, caplog):
    """Killed before row 1's second command (its exec fails) or after its last one (the episode
    completes, and the verifier finds the container dead): either way a masked member, counted in
    sandbox_errors and named (container, task, attempt) in one warning."""
    task = load_task(task_path("make_greeting"))
    killed = []

    def script(r, traj):
        if r == 1 and len(traj.turns) == kill_at_turn and not killed:
            docker_client.api.kill(producer.current_sandboxes[1].id)
            killed.append(producer.current_sandboxes[1].name)
        return FIX[len(traj.turns)]

    producer = make_producer(bank, task, sampler, tok, script)
    store = PolicyStore(5, None)
    workers = RolloutWorkers(producer, store, queue_size=1)
    stream = GroupStream(workers, StreamConfig(groups_per_step=1, group_size=2, seq_len=2048, pad_id=0,
                                               min_valid=1, dynamic_sampling=False), store=store)
    it = iter(stream)
    try:
        batch = next(it)
    finally:
        stream.stop()
    assert killed and workers.counters.errors == 0
    named = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and killed[0] in r.getMessage()]
    assert len(named) == 1 and task.name in named[0] and "attempt 2 of 2" in named[0], named
    stats = batch["stats"]
    assert stats["sandbox_errors"] == 1 and stats["members_invalid"] == 1 and stats["trajectories"] == 1
    assert float(stats["reward_mean"]) == 1.0  # the surviving member fixed the task
    # row 1 (killed): an all-pad, zero-weight row; row 0 trains on its sampled tokens only
    assert batch["weights"][1].sum() == 0 and batch["loss_mask"][1].sum() == 0
    assert batch["weights"][0, 0] == 1.0 and batch["loss_mask"][0].sum() > 0
    with pytest.raises(Exception):  # the killed container is gone (closed), nothing leaks
        docker_client.containers.get(killed[0])  # a container name


def test_seeding_from_fault_commands_banks_the_scripted_failure_once(bank, task_path, sampler, tok):
    """failures_from="fault_commands": the task's scripted fault attempt is run, verified (it
    fails) and banked with the rendered tokens; a second call (a resumed run) adds nothing; a
    recovery group from it is token-exact with the render of history + retry turn."""
    from reterm_jax.rl.grpo.bank_fill import SCRIPTED_FAULT, rendered_failure_tokens
    task = load_task(task_path("make_greeting"))
    cfg = RecoveryConfig(group_size=2, limits=Limits.tiny(max_new_tokens_per_turn=160, max_tokens=2048),
                         failures_from="fault_commands", engine="lockstep")
    producer = RecoveryProducer(bank, [task], sampler, tok, cfg,
                                script=lambda r, t: (FIX if r == 0 else GIVE_UP)[len(t.turns)])
    assert producer.seed_from_faults() == 1 and len(bank) == 1
    assert producer.seed_from_faults() == 0 and len(bank) == 1
    entry = bank.get(bank.entry_ids()[0])
    assert entry.end_reason == SCRIPTED_FAULT and entry.policy_version == -1 and entry.reward < 1.0
    assert entry.tokens == rendered_failure_tokens(tok, entry.messages)
    expected = tok(harness.prompt_text(harness.initial_messages("", history=entry.messages)),
                   add_special_tokens=False)["input_ids"]
    assert producer.recovery_prompt(entry) == list(expected)
    group = producer.produce(0, None, jax.random.key(0))
    assert group.failure_id == entry.entry_id and group.valid == [True, True]
    assert group.resolved == [True, False]  # the scripted fix resolves, giving up does not
    with pytest.raises(ValueError, match="failures_from"):
        RecoveryConfig(failures_from="bogus")
    with pytest.raises(ValueError, match="engine='slots'"):
        RecoveryConfig(engine="slots")


def test_teacher_guidance_replaces_a_failed_member_of_an_all_fail_group(bank, task_path, sampler, tok):
    """guide="teacher": when every sampled attempt fails, the task's oracle recovery runs in a new
    branch of the same state, teacher-forced through the policy's sampler (its tokens continue the
    same prompt, its log-probs are the policy's), is verified, and replaces the last member; the
    bank records the sampled outcomes only. With guide="off" the group stays all-fail."""
    from reterm_jax.rl.grpo import guidance
    from reterm_jax.rl.inference.sampling import SamplingParams
    task = load_task(task_path("make_greeting"))
    limits = Limits.tiny(max_new_tokens_per_turn=160, max_tokens=2048)
    groups = {}
    for guide in ("off", "teacher"):
        cfg = RecoveryConfig(group_size=2, limits=limits, failures_from="fault_commands", guide=guide,
                             sampling=SamplingParams(0.7), engine="lockstep")
        producer = RecoveryProducer(bank, [task], sampler, tok, cfg, script=lambda r, t: GIVE_UP[len(t.turns)])
        producer.seed_from_faults()
        groups[guide] = (producer.produce(0, None, jax.random.key(0)), producer)
    off, _ = groups["off"]
    assert off.resolved == [False, False] and off.guided == [False, False]
    group, producer = groups["teacher"]
    entry = bank.get(group.failure_id)
    assert group.valid == [True, True] and group.resolved == [False, True] and group.rewards == [0.0, 1.0]
    assert group.guided == [False, True] and producer.stats.guided == 1 and producer.stats.guide_failed == 0
    assert bank.outcomes(entry.entry_id)["passes"] == 0  # two groups of sampled failures; the teacher's not counted
    teacher = group.trajectories[1]
    prompt = producer.recovery_prompt(entry)
    assert teacher.tokens[:len(prompt)] == prompt and teacher.end_reason == harness.COMPLETED
    mask = np.array(teacher.loss_mask, bool)
    turns = guidance.teacher_turns(task)
    assert tok.decode(np.array(teacher.tokens)[mask].tolist(), skip_special_tokens=False) == "".join(turns)
    logp = np.array(teacher.logprobs)[mask]
    assert np.isfinite(logp).all() and (logp <= 0).all() and (logp < 0).any()  # the policy's own log-probs
    assert [c for t in teacher.turns for c in t.commands] == ["echo 'hello, sandbox' > /app/greeting.txt"]
    assert assess(group, 0, StreamConfig(groups_per_step=1, group_size=2, seq_len=2048, pad_id=0)).usable
    with pytest.raises(ValueError, match="guide="):
        RecoveryConfig(guide="oracle")


def test_partial_credit_ranks_the_attempts_of_an_all_fail_group(tmp_path, sampler, tok, docker_client):
    """rollout.partial_credit on a generated ini-retarget task: neither attempt passes, but the one
    that restores the file from git and moves the section with one wrong letter in the host comes
    closer than the one that gives up, so with partial credit the group's rewards differ (a
    signal), while resolved, the bank and partial_credit=0 stay binary. Through the continuous
    engine, the production default."""
    from reterm_jax.tasks.generate import generate, make_instance, parse_families
    (family,) = parse_families("ini-retarget")
    (d,) = generate([family], "train", 1, seed=4, out=tmp_path / "tasks")
    task = load_task(d)
    expect = make_instance(family, "train", 4, 0).expect  # the instance generate wrote
    fix = (f"git -C /app/config checkout -- app.ini && sed -i '/^\\[{expect['section']}\\]/,/^\\[/"
           f"{{s/^host = .*/host = x{expect['host'][1:]}/;s/^port = .*/port = {expect['port']}/}}' /app/config/app.ini")
    restore = ["Restore it and move the section.\n</think>\n\n" + bash_call_xml(fix) + "<|im_end|>",
               "Done.\n</think>\n\nThe task is complete.<|im_end|>"]
    rewards = {}
    for credit in (0.0, 0.5):
        bank = FailureBank(tmp_path / f"bank{credit}")
        try:
            cfg = RecoveryConfig(group_size=2, limits=Limits.tiny(max_new_tokens_per_turn=160, max_tokens=2048),
                                 failures_from="fault_commands", engine="continuous", decode_burst=16,
                                 partial_credit=credit)
            producer = RecoveryProducer(bank, [task], sampler, tok, cfg,
                                        script=lambda r, t: (restore if r == 0 else GIVE_UP)[len(t.turns)])
            producer.seed_from_faults()
            group = producer.produce(0, None, jax.random.key(0))
            assert group.valid == [True, True] and group.resolved == [False, False]
            assert bank.outcomes(group.failure_id)["passes"] == 0
            near, gave_up = (t.partial for t in group.trajectories)
            assert 0 < gave_up < near < 1 and all(t.reward == 0.0 for t in group.trajectories)
            rewards[credit] = group.rewards
            usable = assess(group, 0, StreamConfig(groups_per_step=1, group_size=2, seq_len=2048, pad_id=0,
                                                   signal="reward")).usable
            assert usable == (credit > 0)
        finally:
            bank.destroy()
    assert rewards[0.0] == [0.0, 0.0]
    assert rewards[0.5] == pytest.approx([0.5 * near, 0.5 * gave_up])


def test_seeding_many_tasks_is_bounded_by_the_bank_and_collect_batch(tmp_path, sampler, tok, docker_client):
    """Seeding from more tasks than the bank holds banks only what fits (a seeded sample), with
    collect_batch sandboxes at a time: it used to start one per task at once (960 on 2 cores)."""
    import threading

    from reterm_jax.sandbox import verify
    from reterm_jax.tasks.generate import generate, parse_families
    dirs = generate(parse_families("ini-retarget"), "train", 5, seed=3, out=tmp_path / "tasks")
    tasks = [load_task(d) for d in dirs]
    busy, peak, lock = [0], [0], threading.Lock()

    def counting_verify(sandbox, task, snapshot=None, in_place=False):
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        try:
            return verify(sandbox, task, snapshot=snapshot, in_place=in_place)
        finally:
            with lock:
                busy[0] -= 1

    bank = FailureBank(tmp_path / "bank", max_entries=3)
    try:
        cfg = RecoveryConfig(group_size=2, limits=Limits.tiny(), failures_from="fault_commands", collect_batch=1)
        producer = RecoveryProducer(bank, tasks, sampler, tok, cfg, verify_fn=counting_verify)
        assert producer.seed_from_faults() == 3 and len(bank) == 3
        assert peak[0] == 1  # one sandbox at a time (collect_batch=1)
        assert producer.seed_from_faults() == 0 and len(bank) == 3  # no room left: nothing runs
        banked = sorted(bank.get(e).task_name for e in bank.entry_ids())
        again = FailureBank(tmp_path / "bank2", max_entries=3)
        try:  # the sample is seeded: the same tasks again
            RecoveryProducer(again, tasks, sampler, tok, cfg).seed_from_faults()
            assert sorted(again.get(e).task_name for e in again.entry_ids()) == banked
        finally:
            again.destroy()
    finally:
        bank.destroy()


def test_prefetch_branches_the_next_group_while_this_one_runs(bank, task_path, sampler, tok, docker_client,
                                                              monkeypatch):
    """prefetch=True: a group draws the next entry and starts its G branches before its own attempts;
    the next produce() runs in those containers (no branch of its own); an entry is never branched
    ahead of itself (its pin would keep record() from retiring it); a stopping worker closes what it
    started ahead."""
    task = load_task(task_path("make_greeting"))
    cfg = RecoveryConfig(group_size=2, limits=Limits.tiny(max_new_tokens_per_turn=160, max_tokens=2048),
                         min_failures=2, collect_batch=2, prefetch=True, engine="lockstep")
    producer = RecoveryProducer(bank, [task], sampler, tok, cfg, script=lambda r, t: GIVE_UP[len(t.turns)],
                                collect_script=lambda r, t: FAILED[len(t.turns)])
    branched = []
    real_branch = bank.branch
    monkeypatch.setattr(bank, "branch", lambda entry, n, **kw: branched.append(entry.entry_id) or
                        real_branch(entry, n, **kw))
    first = producer.produce(1, None, jax.random.key(0))
    assert len(bank) == 2 and first.valid == [True, True]
    entry, pending = producer.prefetcher.held  # the bank's next entry, its branches started ahead
    assert entry.entry_id != first.failure_id and branched == [first.failure_id, entry.entry_id]
    ahead = pending.result()
    assert [docker_client.containers.get(sb.id).status for sb in ahead] == ["running", "running"]
    assert bank.pinned() == {entry.entry_id}
    cursor = bank.state()
    second = producer.produce(2, None, jax.random.key(1))
    assert second.failure_id == entry.entry_id and second.valid == [True, True] and second.sandbox_errors == 0
    assert entry.entry_id not in branched[2:]  # it ran in the containers started ahead, now closed
    for sb in ahead:
        with pytest.raises(Exception):
            docker_client.containers.get(sb.id)
    assert bank.state()["pos"] == cursor["pos"] + 1 or bank.state()["epoch"] == cursor["epoch"] + 1
    held_id = producer.prefetcher.held[0].entry_id
    if held_id == second.failure_id:  # the new epoch starts with the entry just run: drawn, not branched
        assert producer.prefetcher.held[1] is None and branched[2:] == []
    # a worker closes what its producer started ahead when it stops: no pin, no container left
    store = PolicyStore(3, None)
    workers = RolloutWorkers(producer, store, queue_size=1).start()
    assert workers.get(timeout=120) is not None
    workers.stop()
    assert producer.prefetcher.held is None and bank.pinned() == set()
    mine = [f"{labels.KIND}={labels.KIND_CONTAINER}", f"{labels.OWNER}={labels.owner_id()}"]
    assert not docker_client.containers.list(all=True, filters={"label": mine})
