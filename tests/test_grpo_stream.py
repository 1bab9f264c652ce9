"""Groups -> batches, the stream's filters, the workers' queue, and the synthetic producer. No Docker.

Groups for the filter tests are built by hand (`make_group`) and fed by a list-backed producer;
the synthetic producer runs the real tiny model and sampler; the recovery prompt path runs
run_episodes on a local bash (test_rl_rollout.LocalShell).
"""
import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from reterm_jax.data import load_tokenizer, special_ids
from reterm_jax.model import Qwen3_5Config, Qwen3_5ForCausalLM
from reterm_jax.rl.agent import harness
from reterm_jax.rl.grpo.groups import BATCH_KEYS, Group, groups_to_batch
from reterm_jax.rl.agent.harness import Limits, bash_call_xml, initial_messages
from reterm_jax.rl.inference.policy_store import PolicyStore
from reterm_jax.rl.agent.rollout import run_episodes
from reterm_jax.rl.inference.sampler import Sampler
from reterm_jax.rl.inference.sampling import SamplingParams, token_logprobs
from reterm_jax.rl.grpo.stream import GroupStream, StreamConfig, assess
from reterm_jax.rl.agent.trajectory import Trajectory
from reterm_jax.rl.grpo.workers import RolloutWorkers, SyntheticProducer, match_fraction, sampler_with
from rl_test_utils import tiny_sampler
from test_rl_rollout import LocalShell

PAD = 0


def make_traj(context=(10, 11, 12), sampled=(13, 14), logprobs=(-0.1, -0.2), obs=(15,), more=(16,),
              more_lp=(-0.3,), end=harness.COMPLETED) -> Trajectory:
    t = Trajectory(task_id="t", episode_id="e", messages=[], end_reason=end)
    t.add_context(context)
    t.add_sampled(sampled, logprobs)
    if obs:
        t.add_context(obs)
        t.add_sampled(more, more_lp)
    return t


def make_group(rewards, valid=None, version=0, threshold=1.0, trajs=None, sandbox_errors=0, gid="g") -> Group:
    g = len(rewards)
    valid = [True] * g if valid is None else valid
    trajs = trajs or [make_traj() for _ in range(g)]
    return Group(gid, "t", "", version, trajs, list(valid), [float(r) if v else 0.0 for r, v in zip(rewards, valid)],
                 [v and r >= threshold for r, v in zip(rewards, valid)], sandbox_errors=sandbox_errors)


class ListProducer:
    """A GroupProducer over prepared groups (the inline / worker source for the filter tests)."""

    def __init__(self, groups):
        self.groups, self.calls = list(groups), 0

    def produce(self, version, params, key):
        self.calls += 1
        return self.groups.pop(0) if self.groups else None


def cfg(**kw):
    base = dict(groups_per_step=2, group_size=4, seq_len=12, pad_id=PAD, min_valid=2)
    base.update(kw)
    return StreamConfig(**base)


# ---- groups_to_batch -----------------------------------------------------------------------------
def test_groups_to_batch_shifts_targets_and_masks_only_sampled_tokens():
    traj = make_traj()
    assert traj.tokens == [10, 11, 12, 13, 14, 15, 16] and traj.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    g = Group("g", "t", "", 0, [traj, make_traj()], [True, False], [1.0, 0.0], [True, False])
    b = groups_to_batch([g], seq_len=10, pad_id=PAD, advantages=[[0.5, -0.5]], weights=[0.75])
    assert set(b) == set(BATCH_KEYS) and all(v.shape == (2, 10) for v in b.values())
    np.testing.assert_array_equal(b["tokens"][0], [10, 11, 12, 13, 14, 15, 16, 0, 0, 0])
    np.testing.assert_array_equal(b["targets"][0, :6], [11, 12, 13, 14, 15, 16])
    np.testing.assert_array_equal(b["positions"][0, :7], np.arange(7))
    np.testing.assert_array_equal(b["segment_ids"][0], [1] * 7 + [0] * 3)
    # targets[t] is sampled <=> loss_mask[t]: 13, 14 (after the prompt) and 16 (after the observation)
    np.testing.assert_array_equal(b["loss_mask"][0], [0, 0, 1, 1, 0, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(b["old_logprobs"][0], [0, 0, -0.1, -0.2, 0, -0.3, 0, 0, 0, 0])
    assert (b["targets"][0][b["loss_mask"][0] == 1] == [13, 14, 16]).all()
    np.testing.assert_allclose(b["advantages"][0], 0.5)
    np.testing.assert_allclose(b["weights"][0], 0.75)
    # the invalid member: an all-pad row that attends to nothing and trains nothing
    assert b["segment_ids"][1].sum() == 0 and b["loss_mask"][1].sum() == 0 and b["weights"][1].sum() == 0
    assert (b["tokens"][1] == PAD).all()


def test_groups_to_batch_rejects_a_trajectory_longer_than_seq_len():
    g = make_group([1.0, 0.0])
    with pytest.raises(ValueError, match="seq_len=6"):
        groups_to_batch([g], seq_len=6, pad_id=PAD, advantages=[[1.0, -1.0]], weights=[1.0])
    # seq_len == trajectory length fits (the last position has no target)
    b = groups_to_batch([g], seq_len=7, pad_id=PAD, advantages=[[1.0, -1.0]], weights=[1.0])
    assert b["loss_mask"][0, -1] == 0 and b["loss_mask"][0].sum() == 3


# ---- the stream's filters ------------------------------------------------------------------------
def test_staleness_drop_and_weight():
    fresh, old = make_group([1, 0, 0, 1], version=5), make_group([1, 0, 1, 1], version=2)
    dropped = assess(old, 5, cfg(max_staleness=2))
    assert dropped.staleness == 3 and dropped.weight == 0 and not dropped.usable
    weighted = assess(old, 5, cfg(max_staleness=1, staleness_mode="weight", stale_weight=0.5))
    assert weighted.weight == 0.25 and weighted.usable and weighted.stale
    assert assess(fresh, 5, cfg(max_staleness=0)).weight == 1.0

    stream = GroupStream(ListProducer([old, fresh, make_group([0, 1, 0, 0], version=4)]), cfg(max_staleness=1))
    stream.set_version(5)
    b = next(iter(stream))
    assert b["stats"]["groups_stale"] == 1 and b["stats"]["groups_seen"] == 3 and b["stats"]["groups_used"] == 2
    assert float(b["stats"]["staleness_mean"]) == 0.5
    np.testing.assert_allclose(b["weights"][:, 0], 1.0)

    stream = GroupStream(ListProducer([old, fresh]), cfg(max_staleness=1, staleness_mode="weight", stale_weight=0.5))
    stream.set_version(5)
    b = next(iter(stream))
    np.testing.assert_allclose(b["weights"][:, 0], [0.25] * 4 + [1.0] * 4)


def test_dynamic_sampling_backfills_to_a_static_batch():
    groups = [make_group([1, 1, 1, 1]), make_group([1, 0, 0, 0]), make_group([0, 0, 0, 0]),
              make_group([0, 0, 0, 0]), make_group([0, 1, 1, 0]), make_group([1, 0, 1, 0]),
              make_group([1, 1, 1, 1]), make_group([0, 0, 0, 1])]
    it = iter(GroupStream(ListProducer(groups), cfg()))
    b1 = next(it)
    assert b1["stats"]["groups_seen"] == 5 and b1["stats"]["groups_filtered"] == 3 and b1["stats"]["groups_used"] == 2
    b2 = next(it)
    for b in (b1, b2):
        assert all(b[k].shape == (8, 12) for k in BATCH_KEYS)
        assert b["stats"]["groups_padded"] == 0 and b["stats"]["trajectories"] == 8
    # the used groups' GRPO advantages: (r - mean) / std over the group
    np.testing.assert_allclose(b1["advantages"][:4, 0], [np.sqrt(3), -1 / np.sqrt(3), -1 / np.sqrt(3),
                                                         -1 / np.sqrt(3)], rtol=1e-5)
    assert float(b1["stats"]["reward_mean"]) == pytest.approx(np.mean([1] * 4 + [1, 0, 0, 0] + [0] * 8 + [0, 1, 1, 0]))
    # without dynamic sampling an all-equal group is used, with zero advantage
    b = next(iter(GroupStream(ListProducer([make_group([1, 1, 1, 1]), make_group([0, 1, 1, 0])]),
                              cfg(dynamic_sampling=False))))
    assert b["stats"]["groups_filtered"] == 0 and (b["advantages"][:4] == 0).all()


def test_a_guided_member_trains_but_is_not_the_policys_reward():
    """A teacher's member (Group.guided, rl/grpo/guidance.py) makes an all-fail group usable and trains
    with the group's advantage like a sampled member, but the reward and pass-rate metrics are the
    policy's own attempts only; the stream counts the guided groups it used."""
    guided = make_group([0, 0, 0, 1])
    guided.guided = [False, False, False, True]
    b = next(iter(GroupStream(ListProducer([guided, make_group([1, 0, 0, 0])]), cfg())))
    assert b["stats"]["groups_used"] == 2 and b["stats"]["groups_guided"] == 1
    np.testing.assert_allclose(b["advantages"][:4, 0], [-1 / np.sqrt(3)] * 3 + [np.sqrt(3)], rtol=1e-5)
    assert b["loss_mask"][3].sum() > 0 and b["weights"][3, 0] == 1.0
    assert float(b["stats"]["reward_mean"]) == pytest.approx(1 / 7)  # 3 + 4 sampled members, one pass
    assert float(b["stats"]["pass_rate"]) == pytest.approx(1 / 7)
    # guided_failure_weight=0: the guided group's failed attempts do not train (only the teacher's
    # member), the other group's rows are untouched, and every row still counts its tokens
    b0 = next(iter(GroupStream(ListProducer([guided, make_group([1, 0, 0, 0])]), cfg(guided_failure_weight=0.0))))
    np.testing.assert_array_equal(b0["weights"][:, 0], [0, 0, 0, 1, 1, 1, 1, 1])
    for k in ("advantages", "loss_mask", "tokens"):
        np.testing.assert_array_equal(b0[k], b[k])
    with pytest.raises(ValueError, match="guided_failure_weight"):
        cfg(guided_failure_weight=-1.0)
    with pytest.raises(ValueError, match="guided flags"):
        Group("g", "t", "", 0, [make_traj()] * 2, [True] * 2, [0.0] * 2, [False] * 2, guided=[True])


def test_max_pulls_pads_with_zero_weight_rows():
    groups = [make_group([0, 0, 0, 0]), make_group([1, 0, 0, 0]), make_group([0, 0, 0, 0])]
    b = next(iter(GroupStream(ListProducer(groups), cfg(max_pulls_per_step=3))))
    assert b["stats"]["groups_padded"] == 1 and b["tokens"].shape == (8, 12)
    assert b["weights"][4:].sum() == 0 and b["loss_mask"][4:].sum() == 0 and b["segment_ids"][4:].sum() == 0


class NoSignalProducer:
    """Groups whose members all score 0, slowly (the policy solves none of its failure states)."""

    def produce(self, version, params, key):
        time.sleep(0.02)
        return make_group([0, 0, 0, 0])


def test_waiting_forever_for_signal_is_logged_and_ends_with_a_message(caplog):
    """max_pulls_per_step=0 used to pull for ever, silently, when no group had signal."""
    stream = GroupStream(NoSignalProducer(), cfg(max_pulls_per_step=0, max_wait_s=0.5, signal_note_s=0.15))
    with caplog.at_level("WARNING", logger="reterm_jax.rl.grpo.stream"):
        with pytest.raises(RuntimeError, match=r"no batch after \d+ s \(stream.max_wait_s=0.5\): \d+ group\(s\) "
                                               r"pulled, 0 of 2 usable; \d+ had no signal"):
            next(iter(stream))
    notes = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    assert 2 <= len(notes) <= 4 and "without signal" in notes[0]


def test_masked_members_and_min_valid():
    # member 1 failed (sandbox): masked out, advantages over the three valid members only
    g = make_group([1, 1, 0, 0], valid=[True, False, True, True], sandbox_errors=1)
    a = assess(g, 0, cfg(min_valid=2))
    assert a.usable
    b = next(iter(GroupStream(ListProducer([g, make_group([1, 0, 1, 0])]), cfg())))
    assert b["weights"][1].sum() == 0 and b["segment_ids"][1].sum() == 0 and b["loss_mask"][1].sum() == 0
    assert b["advantages"][1].sum() == 0
    r = np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(b["advantages"][[0, 2, 3], 0], (r - r.mean()) / r.std(), rtol=1e-5)
    assert b["stats"]["sandbox_errors"] == 1 and b["stats"]["members_invalid"] == 1 and b["stats"]["trajectories"] == 7
    # too few valid members: the group is dropped even though its outcomes differ
    few = make_group([1, 0, 0, 0], valid=[True, True, False, False])
    assert not assess(few, 0, cfg(min_valid=3)).usable and not assess(few, 0, cfg(min_valid=3)).enough_valid
    b = next(iter(GroupStream(ListProducer([few, make_group([1, 0, 1, 0]), make_group([0, 0, 1, 0])]),
                              cfg(min_valid=3))))
    assert b["stats"]["groups_too_few_valid"] == 1 and b["stats"]["groups_filtered"] == 1


def test_overlong_mask_and_penalty():
    long = make_traj(sampled=tuple(range(20, 26)), logprobs=(-0.1,) * 6, obs=())   # 6 sampled tokens
    cut = make_traj(end=harness.TURN_TOO_LONG)                                     # 3 sampled, truncated
    trajs = [make_traj(), long, cut, make_traj()]
    g = make_group([1, 1, 1, 0], trajs=trajs)
    masked = assess(g, 0, cfg(overlong="mask", overlong_max_tokens=4))
    assert masked.valid.tolist() == [True, False, False, True] and masked.overlong == 2 and masked.usable
    shaped = assess(g, 0, cfg(overlong="penalty", overlong_max_tokens=4, overlong_buffer=2, overlong_penalty=1.0))
    # 3 tokens: inside the buffer's start (2) -> -0.5; 6 > max -> -1; truncated -> -1
    np.testing.assert_allclose(shaped.rewards, [0.5, 0.0, 0.0, -0.5])
    counted = assess(g, 0, cfg(overlong_max_tokens=4))  # "none": counted, not masked
    assert counted.overlong == 2 and counted.valid.all()
    assert assess(g, 0, cfg()).overlong == 1  # no token limit: only the truncated end counts


def test_overlong_against_the_attempt_budget_keeps_long_successes_above_failures():
    """overlong_measure="context": the penalty counts the attempt's whole context against its budget,
    at a fraction of the success reward. A success with many sampled tokens but room left in the
    budget is not penalised; one that nears the budget scores less, but more than a failure."""
    def traj(n_context, n_sampled):
        return make_traj(context=tuple(range(n_context)), sampled=tuple(range(n_sampled)),
                         logprobs=(-0.1,) * n_sampled, obs=())
    # budget 100 tokens of context, buffer 20: penalty from 80 to 100
    trajs = [traj(10, 60), traj(10, 85), traj(10, 20), traj(10, 95)]
    g = make_group([1, 1, 0, 0], trajs=trajs)
    shaped = assess(g, 0, cfg(overlong="penalty", overlong_measure="context", overlong_max_tokens=100,
                              overlong_buffer=20, overlong_penalty=0.5))
    # contexts 70, 95, 30, 105 tokens: 0; 15 of 20 into the buffer; 0; past the budget
    np.testing.assert_allclose(shaped.rewards, [1.0, 1.0 - 0.5 * 15 / 20, 0.0, -0.5])
    assert shaped.rewards[1] > shaped.rewards[2]  # a long success beats a failure
    sampled = assess(g, 0, cfg(overlong="penalty", overlong_max_tokens=50, overlong_buffer=0, overlong_penalty=1.0))
    assert sampled.rewards[0] == 0.0  # the old 9B setting: a 60-token success scored like a failure


def test_reward_signal_mode_uses_reward_differences():
    g = make_group([0.5, 0.25, 0.5, 0.5])  # nothing resolved, but the rewards differ
    assert not assess(g, 0, cfg()).has_signal
    assert assess(g, 0, cfg(signal="reward")).has_signal
    assert not assess(make_group([0.5] * 4), 0, cfg(signal="reward")).has_signal


def test_state_round_trip():
    groups = [make_group([1, 0, 0, 0], gid=str(i)) if i % 2 else make_group([0] * 4, gid=str(i)) for i in range(12)]
    it = iter(GroupStream(ListProducer(groups), cfg(groups_per_step=1)))
    next(it), next(it)
    state = it.get_state()
    assert state["batches"] == 2 and state["groups_seen"] == 4 and state["groups_filtered"] == 2
    assert state["pulls"] == 4
    it2 = iter(GroupStream(ListProducer(groups[4:]), cfg(groups_per_step=1)))
    it2.set_state(state)
    assert it2.get_state() == state
    next(it), next(it2)
    assert it.get_state() == it2.get_state()
    with pytest.raises(ValueError, match="unknown"):
        it2.set_state({"bogus": 1})
    assert json.loads(json.dumps(state)) == state  # orbax / grain checkpoint it as JSON
    # an ordinary Grain pipeline stage on top of the stream
    mapped = GroupStream(ListProducer(groups[:2]), cfg(groups_per_step=1)).map(lambda b: b["tokens"].shape)
    assert next(iter(mapped)) == (4, 12)


# ---- workers -------------------------------------------------------------------------------------
class CountingProducer:
    """Produces a usable group per call and counts calls (thread-safe)."""

    def __init__(self):
        self.calls = 0
        self.lock = threading.Lock()

    def produce(self, version, params, key):
        with self.lock:
            self.calls += 1
            n = self.calls
        return make_group([1, 0, 0, 0], version=version, gid=str(n))


def wait_until(cond, what, limit_s=60.0):
    """Poll for a condition the test needs before it can go on (not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


def test_backpressure_and_stop_while_blocked():
    store = PolicyStore(0, None)
    producer = CountingProducer()
    workers = RolloutWorkers(producer, store, queue_size=2).start()
    # two groups fill the queue; the third is produced and then blocks on put
    wait_until(lambda: producer.calls >= 3, "three produce calls")
    wait_until(lambda: workers.queue.full(), "a full queue")
    assert producer.calls == 3 and workers.counters.produced == 2  # blocked: no fourth call
    assert workers.get(timeout=10).group_id == "1"
    wait_until(lambda: workers.counters.produced == 3, "the blocked put goes through")
    wait_until(lambda: producer.calls == 4, "the next group")
    assert workers.stop(timeout=30)  # blocked on a full queue: stop unblocks it and joins
    assert not workers.running and all(not t.is_alive() for t in workers._threads)
    assert workers.queue.empty() and workers.counters.errors == 0


def test_stream_stops_cleanly_and_worker_errors_are_counted():
    class Flaky:
        def __init__(self):
            self.calls = 0

        def produce(self, version, params, key):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("sandbox exploded")
            return make_group([1, 0, 0, 0], version=version) if self.calls == 2 else None

    store = PolicyStore(3, None)
    workers = RolloutWorkers(Flaky(), store, queue_size=1, error_backoff_s=0.0)
    stream = GroupStream(workers, cfg(groups_per_step=1), store=store)
    it = iter(stream)  # starts the workers
    b = next(it)
    assert b["stats"]["groups_used"] == 1 and workers.counters.errors == 1 and "exploded" in workers.last_error
    # no more groups: the iterator blocks on the queue until stop() (from another thread) ends it
    threading.Thread(target=lambda: (time.sleep(0.2), stream.stop())).start()
    with pytest.raises(StopIteration):
        next(it)
    assert not workers.running


def test_a_group_that_outlives_stop_is_abandoned_quietly(caplog):
    # stop() gives up waiting on a long group; the trainer then closes what the group uses (the
    # failure bank), and the group fails: that is the shutdown, not a worker error (run 15's log).
    release = threading.Event()

    class Slow:
        def produce(self, version, params, key):
            release.wait(30)
            raise RuntimeError("the failure bank /x is closed")

    store = PolicyStore(0, None)
    workers = RolloutWorkers(Slow(), store).start()
    wait_until(lambda: workers.running, "a running worker")
    time.sleep(0.1)  # inside produce()
    with caplog.at_level("INFO", logger="reterm_jax.rl.grpo.workers"):
        assert not workers.stop(timeout=0.05)  # the group is still running
        release.set()
        wait_until(lambda: not any(t.is_alive() for t in workers._threads), "the worker ends")
    assert workers.counters.errors == 0 and workers.counters.abandoned == 1 and workers.last_error is None
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert any("abandoned" in r.getMessage() for r in caplog.records)


def test_persistently_failing_workers_surface_their_error():
    class Broken:
        def produce(self, version, params, key):
            raise ConnectionError("docker engine is gone")

    store = PolicyStore(0, None)
    workers = RolloutWorkers([Broken(), Broken()], store, error_backoff_s=0.0, max_consecutive_errors=3)
    with pytest.raises(RuntimeError, match="docker engine is gone"):
        next(iter(GroupStream(workers, cfg(), store=store)))
    assert workers.counters.errors == 6 and workers.gave_up == 2


# ---- synthetic producer with the tiny model ------------------------------------------------------
TARGET = [7, 8, 9, 10]
PROMPT = [5, 6, 11, 12, 13]


@pytest.fixture(scope="module")
def tiny():
    model = Qwen3_5ForCausalLM(Qwen3_5Config.tiny(), rngs=nnx.Rngs(0))
    sampler = Sampler(model, stop_ids=(1,), pad_id=PAD, max_length=32, min_bucket=8, donate=False)
    return model, sampler


def full_forward_logprobs(model, params_state, batch):
    graphdef = nnx.graphdef(model)
    m = nnx.merge(graphdef, params_state)
    logits = m(jnp.asarray(batch["tokens"]), positions=jnp.asarray(batch["positions"]),
               segment_ids=jnp.asarray(batch["segment_ids"]))
    return np.asarray(token_logprobs(logits, jnp.asarray(batch["targets"]), SamplingParams(1.0)))


def test_synthetic_producer_feeds_the_stream_with_its_own_params(tiny):
    model, sampler = tiny
    v0 = nnx.state(model)
    v7 = jax.tree.map(lambda x: x * 1.5 if jnp.issubdtype(x.dtype, jnp.floating) else x, v0)
    producer = SyntheticProducer(sampler, PROMPT, group_size=4, max_new_tokens=6, reward_fn=match_fraction(TARGET))
    store = PolicyStore(0, v0)
    workers = RolloutWorkers(producer, store, queue_size=2, seed=1)
    stream = GroupStream(workers, StreamConfig(groups_per_step=2, group_size=4, seq_len=16, pad_id=PAD,
                                               dynamic_sampling=False, signal="reward", max_staleness=100),
                         store=store)
    it = iter(stream)
    try:
        b = next(it)
        assert all(b[k].shape == (8, 16) for k in BATCH_KEYS)
        # prompt tokens never train; exactly the 6 sampled tokens per row do
        np.testing.assert_array_equal(b["loss_mask"].sum(1), 6)
        assert (b["loss_mask"][:, :len(PROMPT) - 1] == 0).all()
        np.testing.assert_array_equal(b["tokens"][:, :len(PROMPT)], np.tile(PROMPT, (8, 1)))
        ref = full_forward_logprobs(model, v0, b)
        mask = b["loss_mask"] == 1
        np.testing.assert_allclose(b["old_logprobs"][mask], ref[mask], atol=1e-4)
        rewards = [match_fraction(TARGET)(row[len(PROMPT):len(PROMPT) + 6].tolist()) for row in b["tokens"]]
        assert float(b["stats"]["reward_mean"]) == pytest.approx(np.mean(rewards))
        # a new version (the pure-dict form the trainer holds): later groups are sampled with it
        store.publish(7, nnx.to_pure_dict(v7))
        stream.set_version(7)
        while True:
            b = next(it)
            if float(b["stats"]["staleness_mean"]) == 0:
                break
        ref7 = full_forward_logprobs(model, v7, b)
        mask = b["loss_mask"] == 1
        np.testing.assert_allclose(b["old_logprobs"][mask], ref7[mask], atol=1e-4)
    finally:
        stream.stop()
    assert not workers.running


def test_synthetic_producer_inline(tiny):
    model, sampler = tiny
    producer = SyntheticProducer(sampler, PROMPT, group_size=4, max_new_tokens=6, reward_fn=match_fraction(TARGET))
    store = PolicyStore(0, nnx.state(model))
    stream = GroupStream(producer, StreamConfig(groups_per_step=1, group_size=4, seq_len=16, pad_id=PAD,
                                                dynamic_sampling=False), store=store, seed=3)
    b1, b2 = next(iter(stream)), next(iter(stream))  # same seed, same pull index: same samples
    np.testing.assert_array_equal(b1["tokens"], b2["tokens"])
    it = iter(stream)
    next(it)
    assert not np.array_equal(next(it)["tokens"], b1["tokens"])
    assert sampler_with(sampler, None).params is sampler.params


def test_policy_store_publishes_an_inference_dtype_copy(tiny):
    """dtype=bf16: every floating leaf is published as a bf16 copy of the trainer's value (ints as
    they are), and a sampler samples with it."""
    model, sampler = tiny
    params = nnx.state(model)
    store = PolicyStore(0, params, dtype=jnp.bfloat16)
    _, published = store.latest()
    pairs = list(zip(jax.tree.leaves(published), jax.tree.leaves(params)))
    assert any(jnp.issubdtype(b.dtype, jnp.floating) for _, b in pairs)
    for a, b in pairs:
        assert a.dtype == (jnp.bfloat16 if jnp.issubdtype(b.dtype, jnp.floating) else b.dtype)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b.astype(a.dtype)))
    s = sampler_with(sampler, published)
    state, gen = s.generate(s.extend(s.init(1), [PROMPT]), jax.random.key(0), SamplingParams(0.0), 4)
    assert len(gen.tokens[0]) == 4 or gen.stopped[0]


# ---- the recovery prompt: failed tokens + retry turn, token in / token out -----------------------
def test_retry_turn_text_matches_the_chat_template():
    history = initial_messages("Make out.txt.")
    history.append({"role": "assistant", "content": "The task is complete.", "reasoning_content": "done"})
    full = harness.prompt_text(initial_messages("Make out.txt.", history=history))
    assert full.endswith("The task is complete.<|im_end|>" + harness.retry_turn_text())


@pytest.mark.slow
def test_recovery_episode_continues_the_failed_tokens(tmp_path):
    tok = load_tokenizer()
    ids = special_ids(tok)
    sampler = tiny_sampler(tok, max_length=1024)
    limits = Limits.tiny(max_new_tokens_per_turn=64, max_tokens=1024)
    failed_turns = ["Write it.\n</think>\n\n" + bash_call_xml("echo nope > out.txt") + "<|im_end|>",
                    "Done.\n</think>\n\nThe task is complete.<|im_end|>"]
    (failed,) = run_episodes(sampler, tok, [LocalShell(tmp_path)], [initial_messages("Write yes to out.txt.")],
                             task_ids=["t"], limits=limits, script=lambda r, t: failed_turns[len(t.turns)])
    assert failed.end_reason == harness.COMPLETED and failed.tokens[-1] == ids.im_end
    retry = tok(harness.retry_turn_text(), add_special_tokens=False)["input_ids"]
    prompt = failed.tokens + retry
    messages = initial_messages("Write yes to out.txt.", history=failed.messages)
    fix = ["Fix it.\n</think>\n\n" + bash_call_xml("echo yes > out.txt") + "<|im_end|>",
           "Fixed.\n</think>\n\nThe task is complete.<|im_end|>"]
    trajs = run_episodes(sampler, tok, [LocalShell(tmp_path), LocalShell(tmp_path)], [messages] * 2,
                         task_ids=["t"] * 2, limits=limits, prompt_tokens=[prompt] * 2,
                         script=lambda r, t: fix[len(t.turns)] if r == 0 else fix[1])
    for traj in trajs:
        assert traj.tokens[:len(prompt)] == prompt and traj.prompt_len == len(prompt)
        assert sum(traj.loss_mask[:len(prompt)]) == 0  # the failed attempt and the retry turn never train
        assert traj.train_from_message_index == len(messages) and traj.messages[:len(messages)] == messages
    mask = np.array(trajs[0].loss_mask, bool)
    assert tok.decode(np.array(trajs[0].tokens)[mask].tolist(), skip_special_tokens=False) == "".join(fix)
    assert (tmp_path / "out.txt").read_text() == "yes\n"
    # the record is the template's render of the messages except for the failed attempt's dropped <think>
    # (the reason recovery never re-renders): the retry turn and the recovery turns tokenise identically
    assert tok.decode(trajs[1].tokens[len(failed.tokens):]).startswith(harness.retry_turn_text())


def test_policy_store_publishes_a_stacked_trainer_per_layer():
    """A scan_layers trainer's params (stacked by block) are published in the per-layer layout the
    samplers run, cast in the same jit; sampler_with also takes a stacked tree as it is."""
    from reterm_jax.model.stacked import is_stacked, unstack_params
    cfg = Qwen3_5Config.tiny(num_hidden_layers=4, layer_types=("linear_attention", "full_attention") * 2)
    stacked = nnx.to_pure_dict(nnx.state(Qwen3_5ForCausalLM(cfg, scan_layers=True, rngs=nnx.Rngs(0)), nnx.Param))
    per_layer = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))  # the same weights per layer
    sampler = Sampler(per_layer, stop_ids=(1,), pad_id=PAD, max_length=32, min_bucket=8, donate=False)
    assert is_stacked(stacked)
    _, published = PolicyStore(0, stacked, dtype=jnp.bfloat16).latest()
    assert not is_stacked(published)
    want = jax.tree.map(lambda x: x.astype(jnp.bfloat16), unstack_params(stacked))
    assert jax.tree.structure(published) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(published), jax.tree.leaves(want)):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _, fp32 = PolicyStore(0, stacked).latest()  # no dtype: a per-layer copy, values unchanged
    for a, b in zip(jax.tree.leaves(fp32), jax.tree.leaves(nnx.to_pure_dict(nnx.state(per_layer, nnx.Param)))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    tokens = []
    for params in (None, fp32, stacked):
        s = sampler_with(sampler, params)
        tokens.append(s.generate(s.extend(s.init(1), [PROMPT]), jax.random.key(0), SamplingParams(0.0), 4)[1].tokens)
    assert tokens[0] == tokens[1] == tokens[2]
