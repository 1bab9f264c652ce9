"""The recovery context GRPO samples from is the context Recovery SFT trained on, token for token:
for every bundled demo row, the rendered failed attempt (rl.recovery.rendered_failure_tokens) +
the retry turn is a prefix of the SFT example's tokens, equal to them up to the first target token;
the rest is the `<think>` opening, which the harness puts in the generation prompt and SFT trains on.
Checked with the tiny tokenizer and with the real Qwen3.5 one (its own pre-tokenizer)."""
import json

import numpy as np
import pytest

from reterm_jax.data import load_tokenizer
from reterm_jax.data.chat import BASH_TOOL, encode_example
from reterm_jax.data.tokenizer import QWEN3_5, TINY_TOKENIZER_DIR
from reterm_jax.rl import harness
from reterm_jax.rl.recovery import rendered_failure_tokens

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
