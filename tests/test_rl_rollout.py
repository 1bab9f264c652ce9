"""Multi-turn episodes without Docker: the token-in/token-out invariant, records and exports.

The environment is a real local bash (a subprocess per command in a temp dir); the Docker
wiring is tested in test_rl_docker.py.
"""
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from reterm_jax.data import encode_example, load_tokenizer, render_text
from reterm_jax.data.schema import validate_row
from reterm_jax.model import Qwen3_5Config, Qwen3_5ForCausalLM
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import bash_call_xml as xml_call
from reterm_jax.rl.agent.harness import Limits, initial_messages
from reterm_jax.rl.agent.rollout import PrefixInvariantError, check_prefix, run_episodes
from reterm_jax.rl.inference.sampling import SamplingParams, token_logprobs
from reterm_jax.sandbox import ExecResult, VerifyResult
from rl_test_utils import tiny_sampler


class LocalShell:
    """bash -c in a directory, stdin closed, with a timeout: the harness's env interface."""

    def __init__(self, cwd):
        self.cwd = str(cwd)

    def exec(self, command, timeout):
        start = time.monotonic()
        try:
            p = subprocess.run(["bash", "-c", command], cwd=self.cwd, stdin=subprocess.DEVNULL, timeout=timeout,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            return ExecResult(p.stdout, p.returncode, duration_s=time.monotonic() - start)
        except subprocess.TimeoutExpired as e:
            return ExecResult((e.stdout or b"").decode(), 124, timed_out=True, duration_s=time.monotonic() - start)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return Qwen3_5ForCausalLM(Qwen3_5Config.tiny(vocab_size=len(tok)), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def sampler(model, tok):
    return tiny_sampler(tok, max_length=2048, model=model)


SCRIPTS = [
    ["Look first.\n</think>\n\nListing.\n\n" + xml_call("echo hello > out.txt && ls") + "<|im_end|>",
     "Oops.\n</think>\n\n<tool_call>\n<function=bash>\ncat out.txt\n</function>\n</tool_call><|im_end|>",
     "Retry.\n</think>\n\n" + xml_call("cat out.txt; exit 3") + "<|im_end|>",
     "It is there.\n</think>\n\nThe task is complete.<|im_end|>"],
    ["Nothing to do.\n</think>\n\nThe task is complete.<|im_end|>"],
]


def trainer_logprobs(model, tokens, params):
    """The trainer's view: one full forward over the whole episode, log-probs of each next token."""
    ids = jnp.asarray(tokens, jnp.int32)[None]
    logits = nnx.jit(lambda m, x: m(x))(model, ids)
    return np.asarray(token_logprobs(logits[0, :-1], ids[0, 1:], params))


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, tok, sampler):
    """Two rows: row 0 runs four turns (one malformed), row 1 completes at once and then idles."""
    envs = [LocalShell(tmp_path_factory.mktemp(f"row{r}")) for r in range(2)]
    return run_episodes(sampler, tok, envs, [initial_messages("Create out.txt.")] * 2, task_ids=["make-out"] * 2,
                        limits=Limits.tiny(max_new_tokens_per_turn=96), params=SamplingParams(1.0),
                        script=lambda r, traj: SCRIPTS[r][len(traj.turns)])


def test_scripted_multi_turn_episodes_keep_the_prefix_invariant(scripted, tok, model):
    trajs = scripted
    assert [t.end_reason for t in trajs] == [harness.COMPLETED, harness.COMPLETED]
    traj = trajs[0]
    assert len(traj.turns) == 4
    # What ran and what came back.
    assert [t.commands for t in traj.turns] == [["echo hello > out.txt && ls"], [""], ["cat out.txt; exit 3"], []]
    assert traj.turns[0].observations == ["out.txt\n[exit code 0]"]
    assert traj.turns[1].tool_calls[0]["error"] and traj.turns[1].exit_codes == [None]
    assert traj.turns[1].observations[0].startswith("[error: ")
    assert traj.turns[2].observations == ["hello\n[exit code 3]"] and traj.turns[2].exit_codes == [3]
    # Token-in/token-out: each turn's context + sampled tokens are a prefix of the next context.
    for a, b in zip(traj.turns, traj.turns[1:]):
        assert a.context_len < a.sampled[0] + 1 and a.sampled[1] <= b.context_len
        assert traj.tokens[:a.sampled[1]] == traj.tokens[:b.context_len][:a.sampled[1]]
        assert a.observation == (a.sampled[1], b.context_len)
    # The pieces equal the render of the recorded conversation, token for token: the chat
    # template's text, tokenised with content kept as text (the malformed call's error observation
    # quotes the call format; its "<tool_call>" is text, not the special token: data/literal.py).
    from reterm_jax.rl.agent.turns import tokenize
    full = tokenize(tok, render_text(traj.messages, harness.TOOLS, keep_marks=True))
    assert traj.tokens == full[:-1]
    text = render_text(traj.messages, harness.TOOLS)
    assert tok.decode(traj.tokens, skip_special_tokens=False) == text[:-1]  # the template's text, minus its last "\n"
    plain = tok(text, add_special_tokens=False)["input_ids"]
    assert plain.count(tok.convert_tokens_to_ids("<tool_call>")) > traj.tokens.count(
        tok.convert_tokens_to_ids("<tool_call>"))  # the quoted format would have become calls
    # The loss mask covers exactly the policy's tokens.
    mask = np.array(traj.loss_mask, bool)
    toks = np.array(traj.tokens)
    assert tok.decode(toks[mask].tolist(), skip_special_tokens=False) == "".join(SCRIPTS[0])
    assert traj.num_sampled == sum(b - a for a, b in (t.sampled for t in traj.turns))
    # Sampler log-probs of the forced tokens equal the trainer's full-forward log-probs.
    ref = trainer_logprobs(model, traj.tokens, SamplingParams(1.0))
    np.testing.assert_allclose(np.array(traj.logprobs)[mask], ref[mask[1:]], rtol=0, atol=1e-4)
    assert len(trajs[1].turns) == 1 and trajs[1].tokens[:trajs[1].prompt_len] == traj.tokens[:traj.prompt_len]


def test_batch_timing_counts_the_scripted_episodes(scripted):
    """Both rows share their batch's timing; it counts every sampled token, the lockstep slots
    (row 1 idles while row 0 runs four turns: occupancy < 1), and time in each phase. The
    stream's per-step metrics add the batches of the groups it saw."""
    from reterm_jax.rl.grpo.groups import Group
    from reterm_jax.rl.grpo.stream import Assessed, rollout_timing
    a, b = scripted
    assert a.timing is b.timing and a.timing["rows"] == 2
    t = a.timing
    assert t["decode_tokens"] == a.num_sampled + b.num_sampled
    assert t["decode_tokens"] < t["row_steps"]
    assert all(t[k] > 0 for k in ("prefill_s", "decode_s", "observe_s", "sandbox_s")) and t["verify_s"] == 0
    group = Group("g", "make-out", "", 0, [a, b], [True, True], [0.0, 1.0], [False, True])
    m = rollout_timing([Assessed(group=group, staleness=0, weight=1.0, valid=np.ones(2, bool),
                                 rewards=np.zeros(2, np.float32), overlong=0, has_signal=True, enough_valid=True)])
    assert m["decode_tok_s"] == pytest.approx(t["decode_tokens"] / t["decode_s"], rel=1e-5)
    assert m["slot_occupancy"] == pytest.approx(t["decode_tokens"] / t["row_steps"], rel=1e-5)
    assert m["time_prefill_s"] == pytest.approx(t["prefill_s"] + t["observe_s"], rel=1e-5)
    assert m["time_sandbox_s"] == pytest.approx(t["sandbox_s"], rel=1e-5)


def test_exports_validate(scripted, tok):
    traj = scripted[0]
    row = traj.to_reterm_row()
    assert row["id"].startswith("make-out:") and row["train_from_message_index"] == 2
    validate_row(row)
    ex = encode_example(row, tok, tools=harness.TOOLS, verify=True)
    assert ex.tokens.tolist()[:-1] == traj.tokens
    # SFT targets also cover each turn's opening "<think>\n" (2 tokens), which in a rollout is part
    # of the generation prompt, not sampled.
    assert ex.loss_mask.sum() == traj.num_sampled + 2 * len(traj.turns)
    atif = traj.to_harbor(model_name="tiny")
    assert atif["schema_version"] == "ATIF-v1.4"
    assert [s["source"] for s in atif["steps"]] == ["system", "user"] + ["agent"] * 4
    assert [s["step_id"] for s in atif["steps"]] == list(range(1, 7))
    first = atif["steps"][2]
    assert first["tool_calls"][0]["arguments"] == {"command": "echo hello > out.txt && ls"}
    assert first["observation"]["results"][0]["content"] == "out.txt\n[exit code 0]"
    assert first["metrics"]["completion_tokens"] == len(first["metrics"]["logprobs"]) > 0
    assert atif["final_metrics"]["total_completion_tokens"] == traj.num_sampled


def test_sampled_episodes_end_cleanly(tmp_path, tok, model, sampler):
    envs = [LocalShell(tmp_path) for _ in range(3)]
    params = SamplingParams(1.0, top_k=50, top_p=0.95)
    trajs = run_episodes(sampler, tok, envs, [initial_messages("Do the task.")] * 3, task_ids=["t"] * 3,
                         limits=Limits.tiny(max_new_tokens_per_turn=24), params=params, key=jax.random.key(1))
    for traj in trajs:
        assert traj.end_reason in harness.END_REASONS and traj.turns
        assert len(traj.tokens) == len(traj.loss_mask) == len(traj.logprobs)
        mask = np.array(traj.loss_mask, bool)
        ref = trainer_logprobs(model, traj.tokens, params)
        np.testing.assert_allclose(np.array(traj.logprobs)[mask], ref[mask[1:]], rtol=0, atol=1e-4)
        assert np.isfinite(np.array(traj.logprobs)[mask]).all()


def test_token_budget_ends_an_episode(tmp_path, tok, sampler):
    prompt_len = len(tok(harness.prompt_text(initial_messages("x")), add_special_tokens=False)["input_ids"])
    (traj,) = run_episodes(sampler, tok, [LocalShell(tmp_path)], [initial_messages("x")], task_ids=["t"],
                           limits=Limits.tiny(max_tokens=prompt_len + 10, max_new_tokens_per_turn=96),
                           params=SamplingParams(1.0), script=lambda r, t: SCRIPTS[0][0])
    assert traj.end_reason == harness.TOKEN_BUDGET and len(traj.tokens) <= prompt_len + 10


def test_check_prefix_detects_divergence():
    seen = np.array([1, 2, 3, 4])
    check_prefix(0, seen, [1, 2, 3, 4], [1, 2, 3])
    with pytest.raises(PrefixInvariantError, match="first difference at 2"):
        check_prefix(0, seen, [1, 2, 9, 4], None)  # e.g. a re-tokenised history
    with pytest.raises(PrefixInvariantError, match="not a prefix"):
        check_prefix(0, seen, [1, 2, 3, 4], [1, 5])


class DeadEnv:
    """An environment whose sandbox has died: every exec reports the failure (as DockerSandbox does)."""

    def exec(self, command, timeout):
        return ExecResult("", -1, error="sandbox abc died: container status exited")


def test_a_dead_sandbox_is_a_masked_sample_and_the_batch_goes_on(tmp_path, tok, sampler):
    def verify_out_txt(env):
        ok = (tmp_path / "out.txt").exists()
        return VerifyResult(float(ok), {"reward": float(ok)}, "", 0, False, 0.0, None)

    trajs = run_episodes(sampler, tok, [LocalShell(tmp_path), DeadEnv()], [initial_messages("Create out.txt.")] * 2,
                         task_ids=["t", "t"], limits=Limits.tiny(max_new_tokens_per_turn=96),
                         script=lambda r, traj: SCRIPTS[0][len(traj.turns)], verify_fn=verify_out_txt)
    assert trajs[0].end_reason == harness.COMPLETED and trajs[0].reward == 1.0 and trajs[0].resolved
    dead = trajs[1]
    assert dead.end_reason == harness.SANDBOX_ERROR and "died" in dead.error
    assert dead.reward is None and len(dead.turns) == 1  # not verified: the trainer masks it


def test_each_row_has_its_own_cache_room(tmp_path, tok, sampler, model):
    """Per-row cache positions: a sibling's long turn costs a row no cache slots. Row 1 writes one
    long answer; row 0 runs its four short turns in a cache too small for both in lockstep, and
    ends as cache_full (masked, not penalised) only when its own row fills."""
    long_turn = "Thinking. " * 15 + "\n</think>\n\nThe task is complete.<|im_end|>"
    scripts = [SCRIPTS[0], [long_turn]]
    envs = [LocalShell(tmp_path / "a"), LocalShell(tmp_path / "b")]
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    run = lambda s: run_episodes(s, tok, envs, [initial_messages("Create out.txt.")] * 2, task_ids=["t"] * 2,
                                 limits=Limits.tiny(max_new_tokens_per_turn=200),
                                 script=lambda r, traj: scripts[r][len(traj.turns)])
    roomy = run(sampler)
    assert [t.end_reason for t in roomy] == [harness.COMPLETED] * 2
    need0, need1 = len(roomy[0].tokens), len(roomy[1].tokens)
    # Row 1 fits alone; in lockstep row 0 would also have spent row 1's long turn (> 4 slots) as pads.
    assert need1 < need0 - 4 and need1 - roomy[1].prompt_len > 4
    small = tiny_sampler(tok, max_length=need0 - 4, model=model)
    trajs = run(small)
    assert trajs[1].end_reason == harness.COMPLETED and trajs[1].tokens == roomy[1].tokens
    assert trajs[0].end_reason == harness.CACHE_FULL and len(trajs[0].turns) == 4  # its own last turn hit the end
    assert trajs[0].tokens == roomy[0].tokens[:len(trajs[0].tokens)]
    from reterm_jax.rl.grpo.recovery import RecoveryConfig
    from reterm_jax.rl.grpo.stream import TRUNCATED
    assert harness.CACHE_FULL in RecoveryConfig().mask_end_reasons and harness.CACHE_FULL not in TRUNCATED
