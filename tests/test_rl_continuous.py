"""Continuous batching over slots (rl/agent/continuous.py) against the lockstep engine (rl/agent/rollout.py).

More episodes than slots, each in a real local bash: scripted and greedy episodes are the same
token for token as lockstep's, a slot whose episode waits on its tool call does not hold the
others up, and a dead sandbox ends only its own episode.
"""
import threading

import jax
import numpy as np
import pytest
from flax import nnx

from reterm_jax.data import load_tokenizer
from reterm_jax.model import Qwen3_5Config, Qwen3_5ForCausalLM
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.continuous import run_continuous
from reterm_jax.rl.agent.harness import Limits, initial_messages
from reterm_jax.rl.agent.harness import bash_call_xml as xml_call
from reterm_jax.rl.agent.rollout import run_episodes
from reterm_jax.rl.inference.sampling import SamplingParams
from reterm_jax.sandbox import VerifyResult
from rl_test_utils import tiny_sampler
from test_rl_rollout import SCRIPTS, DeadEnv, LocalShell

# Episodes of different lengths: 4 turns, 1 turn, 2 turns (a failing command), 3 turns.
EPISODE_SCRIPTS = [
    SCRIPTS[0],
    SCRIPTS[1],
    ["Check.\n</think>\n\n" + xml_call("ls nothing-here") + "<|im_end|>", "Done.\n</think>\n\nThe task is complete.<|im_end|>"],
    ["One.\n</think>\n\n" + xml_call("echo a > a.txt") + "<|im_end|>", "Two.\n</think>\n\n" + xml_call("cat a.txt")
     + "<|im_end|>", "Three.\n</think>\n\nThe task is complete.<|im_end|>"],
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def sampler(tok):
    model = Qwen3_5ForCausalLM(Qwen3_5Config.tiny(vocab_size=len(tok)), rngs=nnx.Rngs(0))
    return tiny_sampler(tok, max_length=1024, model=model)


def _envs(tmp_path, n, tag):
    dirs = [tmp_path / f"{tag}{e}" for e in range(n)]
    for d in dirs:
        d.mkdir()
    return [LocalShell(d) for d in dirs]


def _verify_out_txt(env):
    import os
    ok = os.path.exists(os.path.join(env.cwd, "out.txt"))
    return VerifyResult(float(ok), {"reward": float(ok)}, "", 0, False, 0.0, None)


def _same(a, b):
    assert a.end_reason == b.end_reason and a.tokens == b.tokens and a.loss_mask == b.loss_mask
    assert a.messages == b.messages and a.prompt_len == b.prompt_len
    assert [t.commands for t in a.turns] == [t.commands for t in b.turns]
    assert [t.observations for t in a.turns] == [t.observations for t in b.turns]
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
    assert (a.reward, a.resolved) == (b.reward, b.resolved)


@pytest.mark.parametrize("slots,burst", [(2, 8), (3, 32)])
def test_scripted_episodes_equal_lockstep(tmp_path, tok, sampler, slots, burst):
    n = 6  # more episodes than slots: freed slots take the queued ones
    scripts = [EPISODE_SCRIPTS[e % len(EPISODE_SCRIPTS)] for e in range(n)]
    kw = dict(task_ids=["t"] * n, limits=Limits.tiny(max_new_tokens_per_turn=96), verify_fn=_verify_out_txt,
              script=lambda e, traj: scripts[e][len(traj.turns)])
    msgs = [initial_messages("Create out.txt.")] * n
    lock = run_episodes(sampler, tok, _envs(tmp_path, n, "l"), msgs, **kw)
    cont = run_continuous(sampler, tok, _envs(tmp_path, n, "c"), msgs, slots=slots, burst=burst, **kw)
    for a, b in zip(lock, cont):
        _same(a, b)
    assert [t.reward for t in cont] == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    timing = cont[0].timing
    assert timing["rows"] == slots and timing["decode_tokens"] == sum(t.num_sampled for t in cont)
    assert 0 < timing["decode_tokens"] <= timing["row_steps"]


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(1.0)], ids=["greedy", "sampled"])
def test_model_episodes_equal_lockstep(tmp_path, tok, sampler, params):
    """Per-row randomness: episode e's i-th token draws from fold_in(fold_in(key, e), i) in both
    engines, whatever slot or batch it runs in."""
    n = 3
    kw = dict(task_ids=["t"] * n, limits=Limits.tiny(max_new_tokens_per_turn=40, max_turns=3),
              params=params, key=jax.random.key(5))
    msgs = [initial_messages(f"Task {e}.") for e in range(n)]
    lock = run_episodes(sampler, tok, _envs(tmp_path, n, "l"), msgs, **kw)
    cont = run_continuous(sampler, tok, _envs(tmp_path, n, "c"), msgs, slots=2, burst=16, **kw)
    for a, b in zip(lock, cont):
        _same(a, b)


class GatedShell(LocalShell):
    """A bash whose commands wait until `gate` is set (or 60 s pass): a slow sandbox."""

    def __init__(self, cwd, gate):
        super().__init__(cwd)
        self.gate, self.opened = gate, None

    def exec(self, command, timeout):
        self.opened = self.gate.wait(60)
        return super().exec(command, timeout)


def test_a_slot_waiting_on_its_sandbox_does_not_hold_the_others(tmp_path, tok, sampler):
    """Episode 0's tool call blocks until episode 1 has been verified: lockstep would wait on it
    for 60 s; here episode 1 decodes, ends and is verified while episode 0 waits."""
    gate = threading.Event()
    (tmp_path / "g").mkdir()
    (tmp_path / "f").mkdir()
    slow, fast = GatedShell(tmp_path / "g", gate), LocalShell(tmp_path / "f")
    scripts = [SCRIPTS[0], ["Quick.\n</think>\n\n" + xml_call("echo hi > out.txt") + "<|im_end|>",
                            "Done.\n</think>\n\nThe task is complete.<|im_end|>"]]

    def verify(env):
        if env is fast:
            gate.set()
        return _verify_out_txt(env)

    trajs = run_continuous(sampler, tok, [slow, fast], [initial_messages("Create out.txt.")] * 2, task_ids=["t"] * 2,
                           limits=Limits.tiny(max_new_tokens_per_turn=96), slots=2, burst=8, verify_fn=verify,
                           script=lambda e, traj: scripts[e][len(traj.turns)])
    assert slow.opened is True  # released by the fast episode's verification, not by the timeout
    assert [t.end_reason for t in trajs] == [harness.COMPLETED] * 2 and [t.reward for t in trajs] == [1.0, 1.0]


def test_a_dead_sandbox_ends_only_its_episode(tmp_path, tok, sampler):
    envs = [DeadEnv(), *_envs(tmp_path, 2, "d")]
    trajs = run_continuous(sampler, tok, envs, [initial_messages("Create out.txt.")] * 3, task_ids=["t"] * 3,
                           limits=Limits.tiny(max_new_tokens_per_turn=96), slots=2, verify_fn=_verify_out_txt,
                           script=lambda e, traj: SCRIPTS[0][len(traj.turns)], key=jax.random.key(3))
    assert trajs[0].end_reason == harness.SANDBOX_ERROR and trajs[0].reward is None and "died" in trajs[0].error
    assert [t.end_reason for t in trajs[1:]] == [harness.COMPLETED] * 2 and [t.reward for t in trajs[1:]] == [1.0] * 2


def test_bad_arguments_fail_before_anything_runs(tok, sampler):
    with pytest.raises(ValueError, match="slots=0"):
        run_continuous(sampler, tok, [None], [[]], task_ids=["t"], limits=Limits.tiny(), slots=0)
