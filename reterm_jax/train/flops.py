"""Training FLOPs per token from the model config, and the MFU estimate built on it.

Counted (forward + backward = 3x forward, matmuls only, 2 FLOPs per multiply-add):
  - every projection and the LM head: 6 * (matmul weights)   (the embedding lookup is free);
  - full attention, causal: QK^T and AV over on average seq_len/2 keys: 6 * seq_len * heads * head_dim;
  - chunked gated delta rule, per value head: state read, update and output (3 dk x dv products)
    plus the intra-chunk products over `chunk` tokens: 6 * (3 dk dv + chunk (dk + dv)).
Norms, gates, softmax and the conv are left out (they are a few percent); so MFU is a slight
underestimate, as is usual (PaLM appendix B counts the same way).
"""
from __future__ import annotations

import jax

from reterm_jax.model.config import FULL_ATTENTION, Qwen3_5Config

DELTA_RULE_CHUNK = 64

# Dense bf16 peak FLOP/s per device (vendor figures, no sparsity). CPU has no single figure:
# pass train.peak_flops for a meaningful CPU MFU.
PEAK_FLOPS = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12,
    "H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12,
}


def matmul_params(cfg: Qwen3_5Config) -> int:
    """Weights that take part in a matmul per token (all dense kernels and the LM head)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    mlp = 3 * h * i
    q_width = (2 if cfg.attention_output_gate else 1) * cfg.num_attention_heads * cfg.head_dim
    attn = h * q_width + 2 * h * cfg.num_key_value_heads * cfg.head_dim \
        + cfg.num_attention_heads * cfg.head_dim * h
    delta = h * cfg.linear_conv_dim + h * cfg.linear_value_dim + 2 * h * cfg.linear_num_value_heads \
        + cfg.linear_value_dim * h
    total = cfg.hidden_size * cfg.vocab_size  # LM head (tied or not, it is a matmul)
    for t in cfg.layer_types:
        total += mlp + (attn if t == FULL_ATTENTION else delta)
    return total


def flops_per_token(cfg: Qwen3_5Config, seq_len: int) -> float:
    """Training (fwd + bwd) FLOPs per token at context `seq_len`."""
    n_full = sum(t == FULL_ATTENTION for t in cfg.layer_types)
    n_linear = len(cfg.layer_types) - n_full
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    attention = 6 * seq_len * cfg.num_attention_heads * cfg.head_dim * n_full
    delta_rule = 6 * cfg.linear_num_value_heads * (3 * dk * dv + DELTA_RULE_CHUNK * (dk + dv)) * n_linear
    return 6.0 * matmul_params(cfg) + attention + delta_rule


def peak_flops_per_device(override: float = 0.0) -> float | None:
    """`override` when > 0, else the table entry matching jax.devices()[0].device_kind, else None."""
    if override and override > 0:
        return float(override)
    kind = jax.devices()[0].device_kind
    for name, flops in PEAK_FLOPS.items():
        if name.lower() in kind.lower():
            return flops
    return None


def mfu(tokens_per_second: float, flops_per_tok: float, peak_per_device: float | None,
        n_devices: int) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None when the peak is unknown."""
    if not peak_per_device:
        return None
    return tokens_per_second * flops_per_tok / (peak_per_device * n_devices)
