"""The sampler's greedy tokens equal transformers' `generate` (a reference we did not write).

One batch whose rows have different prompt and observation lengths, so each row writes at its
own cache position (no lockstep padding), against HF generating each row alone, over two turns.
"""
import jax
import numpy as np
import pytest
import torch

from hf_dense_reference import build_hf_dense_model
from hf_reference import VOCAB, build_hf_model
from model_test_utils import load_hf_weights
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM
from reterm_jax.rl.inference.sampler import Sampler
from reterm_jax.rl.inference.sampling import SamplingParams

PAD = 0


def hf_greedy(hf, context: list[int], n: int) -> list[int]:
    ids = torch.tensor([context])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=PAD)
    return out[0, len(context):].tolist()


@pytest.mark.parametrize("variant", ["gqa2_conv4_untied", "llama_gqa3_tied", "qwen3_gqa2_untied"])
def test_greedy_tokens_equal_transformers_generate_per_row(variant):
    hf = build_hf_model(variant) if variant == "gqa2_conv4_untied" else build_hf_dense_model(variant)
    model = load_hf_weights(Qwen3_5ForCausalLM(Qwen3_5Config.from_hf_dict(hf.config.to_dict())), hf)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, VOCAB, n).tolist() for n in (9, 3, 21)]
    observations = [rng.integers(2, VOCAB, n).tolist() for n in (5, 1, 2)]
    sampler = Sampler(model, stop_ids=(), pad_id=PAD, max_length=64, donate=False, min_bucket=4)
    state = sampler.extend(sampler.init(3), prompts)
    state, first = sampler.generate(state, jax.random.key(0), SamplingParams(0.0), 10, row_limits=[10, 6, 8])
    state = sampler.extend(state, observations)
    state, second = sampler.generate(state, jax.random.key(1), SamplingParams(0.0), 7)
    contexts = sampler.contexts(state)
    for r in range(3):
        assert first.tokens[r] == hf_greedy(hf, prompts[r], len(first.tokens[r])), f"row {r}, turn 1"
        history = prompts[r] + first.tokens[r] + observations[r]
        assert second.tokens[r] == hf_greedy(hf, history, 7), f"row {r}, turn 2"
        assert contexts[r].tolist() == history + second.tokens[r]
    # Each row used exactly its own tokens' slots.
    np.testing.assert_array_equal(state.index, [len(c) for c in contexts])
