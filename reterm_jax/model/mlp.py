"""SwiGLU MLP: down(silu(gate(x)) * up(x)), no biases."""
from __future__ import annotations

import jax
from flax import nnx

from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.params import dense


class MLP(nnx.Module):
    def __init__(self, config: Qwen3_5Config, *, dtype, param_dtype, rngs: nnx.Rngs):
        h, i, std = config.hidden_size, config.intermediate_size, config.initializer_range
        kw = dict(init_std=std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = dense(h, i, ("embed", "mlp"), **kw)
        self.up_proj = dense(h, i, ("embed", "mlp"), **kw)
        self.down_proj = dense(i, h, ("mlp", "embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))
