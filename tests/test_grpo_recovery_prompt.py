"""The recovery context GRPO samples from is the context Recovery SFT trained on, token for token:
for every bundled demo row, the rendered failed attempt (rl.grpo.bank_fill.rendered_failure_tokens) +
the retry turn is a prefix of the SFT example's tokens, equal to them up to the first target token;
the rest is the `<think>` opening, which the harness puts in the generation prompt and SFT trains on.
Checked with the tiny tokenizer and with the real Qwen3.5 one (its own pre-tokenizer)."""
import json

import numpy as np
import pytest

from reterm_jax.data import load_tokenizer
from reterm_jax.data.chat import BASH_TOOL, encode_example
from reterm_jax.data.tokenizer import QWEN3_5, TINY_TOKENIZER_DIR
from reterm_jax.rl.agent import harness
from reterm_jax.rl.grpo.bank_fill import rendered_failure_tokens

DEMO = "reterm_jax/assets/demo/reterm_demo.jsonl"


@pytest.mark.parametrize("tokenizer", [TINY_TOKENIZER_DIR, QWEN3_5], ids=["tiny", "qwen3.5"])
def test_recovery_prompt_equals_the_sft_context_of_every_demo_row(tokenizer):
    tok = load_tokenizer(tokenizer)
    retry = tok(harness.retry_turn_text(), add_special_tokens=False)["input_ids"]
    rows = [json.loads(line) for line in open(DEMO)]
    assert rows
    for row in rows:
        start = row["train_from_message_index"]
        history = row["messages"][:start - 1]  # the failed attempt; messages[start - 1] is the retry turn
        assert row["messages"][start - 1] == {"role": "user", "content": harness.RETRY_PROMPT}
        ex = encode_example(row, tok, tools=[BASH_TOOL])
        first_target = int(np.argmax(ex.loss_mask))
        prompt = rendered_failure_tokens(tok, history) + list(retry)
        assert prompt == ex.tokens[:len(prompt)].tolist(), row["id"]
        assert first_target <= len(prompt)
        assert tok.decode(prompt[first_target:]) == "<think>\n", row["id"]


def test_partial_credit_ranks_failed_attempts_below_any_resolved_one():
    from reterm_jax.rl.grpo.recovery import RecoveryConfig, member_reward
    from reterm_jax.rl.agent.trajectory import Trajectory

    def traj(reward, partial=None):
        return Trajectory(task_id="t", episode_id="e", messages=[], reward=reward, resolved=reward >= 1.0,
                          partial=partial)

    assert member_reward(traj(0.0, 0.9), 1.0, 0.0) == 0.0            # off: binary, as the paper
    assert member_reward(traj(0.0, 0.9), 1.0, 0.5) == pytest.approx(0.45)
    assert member_reward(traj(0.0, 1.7), 1.0, 0.5) == pytest.approx(0.5)   # the score is clipped to 0-1
    assert member_reward(traj(0.0), 1.0, 0.5) == 0.0                 # no partial score: its reward
    assert member_reward(traj(1.0, 0.3), 1.0, 0.5) == 1.0            # resolved keeps its reward
    assert member_reward(traj(0.7, 0.2), 1.0, 0.5) == 0.7            # never below the verifier's own reward
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="partial_credit"):
            RecoveryConfig(partial_credit=bad)
