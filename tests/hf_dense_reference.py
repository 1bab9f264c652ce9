"""Tiny transformers Llama and Qwen3 reference models, built on the CPU on the fly (no downloads).

The dense families share our decoder with Qwen3.5 (model/config.py); these variants differ on
purpose (GQA ratio, head size not hidden/heads, tied/untied head, q/k norm on or off) and their
norm weights are perturbed away from 1, so a family option read wrongly shows up in the logits.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

from hf_reference import VOCAB, _KeepFloat64

DENSE_VARIANTS: dict[str, dict] = {
    # SmolLM2's shape in small: GQA 3, tied head, Llama (no q/k norm).
    "llama_gqa3_tied": dict(family="llama", hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                            num_attention_heads=6, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True),
    # Llama with head_dim != hidden / heads, MHA, untied.
    "llama_mha_untied": dict(family="llama", hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, head_dim=12, tie_word_embeddings=False),
    # Qwen3: q/k norms, GQA 2, untied.
    "qwen3_gqa2_untied": dict(family="qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
}


def dense_config(variant: str, **overrides):
    kw = dict(DENSE_VARIANTS[variant])
    family = kw.pop("family")
    kw.update(vocab_size=VOCAB, rms_norm_eps=1e-5, max_position_embeddings=4096, initializer_range=0.08,
              pad_token_id=0, bos_token_id=None, eos_token_id=1,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    kw.update(overrides)
    cfg = (LlamaConfig if family == "llama" else Qwen3Config)(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def build_hf_dense_model(variant: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """A random tiny LlamaForCausalLM / Qwen3ForCausalLM in eval mode, eager attention."""
    torch.manual_seed(seed)
    cfg = dense_config(variant, **overrides)
    model = (LlamaForCausalLM if cfg.model_type == "llama" else Qwen3ForCausalLM)(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.to(dtype).eval()


def _rotary_forward_float64(self, x, position_ids):
    """Llama/Qwen3 RotaryEmbedding.forward with float32 angles (as transformers computes them) but
    cos/sin evaluated in x's dtype, so a float64 model gets float64 cos/sin of those angles."""
    inv_freq, _ = self.compute_default_rope_parameters(self.config, device=x.device)
    freqs = position_ids[..., None].to(torch.float32) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1).to(x.dtype)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


@contextlib.contextmanager
def dense_float64_everywhere():
    """transformers' float64 Llama / Qwen3 computed in float64 throughout (see
    hf_reference.float64_everywhere: the RMS norms' and softmax's float32 casts kept at float64)."""
    classes = (modeling_llama.LlamaRotaryEmbedding, modeling_qwen3.Qwen3RotaryEmbedding)
    saved = [c.forward for c in classes]
    for c in classes:
        c.forward = _rotary_forward_float64
    try:
        with _KeepFloat64():
            yield
    finally:
        for c, f in zip(classes, saved):
            c.forward = f


def dense_logits_float64(model, input_ids: np.ndarray) -> np.ndarray:
    assert next(model.parameters()).dtype == torch.float64, "needs a float64 model"
    with dense_float64_everywhere(), torch.no_grad():
        out = model(input_ids=torch.as_tensor(np.asarray(input_ids), dtype=torch.long))
    return out.logits.double().numpy()
