"""Gated DeltaNet (Qwen3.5's `linear_attn`): projections, segment-aware causal conv, delta rule.

Segments and padding (segment id 0) follow one rule for full forwards, packed rows, prefill
and continuations from a cache:
  * a token "starts a segment" (`reset`) when it is real and its segment id differs from the
    previous real token of its row (or from the cache's last segment); the conv window and the
    recurrent state restart there;
  * padding is transparent to the recurrence: a pad token writes nothing (k = 0) and decays
    nothing (g = 0), so the state leaving a right-padded chunk is the state after its last real
    token, and the conv window carried to the next call is the K-1 real rows ending there.
Supported padding: before a row's first real token, after its last one, or between segments
with different ids. (Padding between two runs of the same segment id would show the conv zeros
instead of the earlier run's last rows.)
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from reterm_jax.model.cache import DeltaNetCache
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.delta_rule import GROUP_TOKENS, delta_rule_grouped, delta_rule_recurrent
from reterm_jax.model.norms import GatedRMSNorm, stat_dtype
from reterm_jax.model.params import dense, logical_param


def segment_starts(segment_ids: jax.Array, last_segment: jax.Array) -> jax.Array:
    """bool [B, T]: real token whose segment differs from the previous real token's (or the cache's)."""
    real = segment_ids != 0
    t = jnp.arange(segment_ids.shape[1])
    last_real = jax.lax.cummax(jnp.where(real, t, -1), axis=1)  # last real index at or before t
    prev = jnp.concatenate([jnp.full_like(last_real[:, :1], -1), last_real[:, :-1]], axis=1)
    prev_segment = jnp.where(prev >= 0, jnp.take_along_axis(segment_ids, jnp.maximum(prev, 0), axis=1),
                             last_segment[:, None])
    return real & (segment_ids != prev_segment)


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """`x * rsqrt(sum(x²) + eps)` over the head dim (FLA / HF form: eps inside the rsqrt)."""
    return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + eps)


def segment_causal_conv(x: jax.Array, window: jax.Array, weight: jax.Array, reset: jax.Array):
    """Depthwise causal conv over time that never reads across a segment start.

    x [B,T,C] (this call's rows), window [B,K-1,C] (rows before them: zeros for a fresh
    sequence, the cache's window in a continuation), weight [C,1,K] (HF layout; tap K-1 is
    the current token), reset [B,T]. Returns (pre-activation y [B,T,C] in fp32 or wider,
    x_ext [B,K-1+T,C], group_ext [B,K-1+T]) where group_ext numbers segments so a tap from
    row s to row t is used only when group_ext[s] == group_ext[t].
    """
    kernel = weight.shape[-1]
    t = x.shape[1]
    x_ext = jnp.concatenate([window.astype(x.dtype), x], axis=1)
    starts = jnp.concatenate([jnp.zeros((reset.shape[0], kernel - 1), bool), reset], axis=1)
    group_ext = jnp.cumsum(starts.astype(jnp.int32), axis=1)
    current = group_ext[:, kernel - 1:]
    f = stat_dtype(x.dtype)
    w = weight[:, 0, :].astype(f)  # [C, K]
    y = jnp.zeros(x.shape, f)
    for tap in range(kernel):  # row t + tap of x_ext is x[t - (K-1) + tap]
        same = (group_ext[:, tap:tap + t] == current)[..., None]
        y = y + jnp.where(same, x_ext[:, tap:tap + t].astype(f), 0.0) * w[:, tap]
    return y, x_ext, group_ext


def next_conv_window(x_ext: jax.Array, group_ext: jax.Array, real: jax.Array, kernel: int) -> jax.Array:
    """The K-1 rows ending at each row's last real token, zeroed where they lie in an earlier segment."""
    b, n, _ = x_ext.shape
    real_ext = jnp.concatenate([jnp.ones((b, kernel - 1), bool), real], axis=1)
    last = jnp.max(jnp.where(real_ext, jnp.arange(n), 0), axis=1)  # >= K-2: window rows count as real
    rows = last[:, None] - (kernel - 2) + jnp.arange(kernel - 1)
    window = jnp.take_along_axis(x_ext, rows[..., None], axis=1)
    keep = jnp.take_along_axis(group_ext, rows, axis=1) == jnp.take_along_axis(group_ext, last[:, None], axis=1)
    return jnp.where(keep[..., None], window, 0).astype(x_ext.dtype)


class DepthwiseConv1d(nnx.Module):
    """Holds `conv1d.weight` [C, 1, K] in HF's layout; the math is `segment_causal_conv`."""

    def __init__(self, channels: int, kernel: int, *, param_dtype, rngs: nnx.Rngs):
        bound = 1.0 / math.sqrt(kernel)  # torch Conv1d default: fan_in = in_channels/groups * K = K
        value = jax.random.uniform(rngs.params(), (channels, 1, kernel), param_dtype, -bound, bound)
        self.weight = logical_param(value, ("linear_qkv", None, "conv_kernel"))


def set_delta_group_tokens(model: nnx.Module, tokens: int) -> None:
    """Set every GatedDeltaNet's (static) group_tokens (`model.delta_group_tokens`), e.g. on an
    abstract model: the delta rule runs over groups of this many tokens, one group's chunk
    matrices alive at a time (model/delta_rule.py::delta_rule_grouped); 0 = the whole row at once."""
    tokens = int(tokens)
    if tokens < 0:
        raise ValueError(f"model.delta_group_tokens={tokens}: use 0 (whole rows) or a positive token count")
    for _, node in nnx.iter_graph(model):
        if isinstance(node, GatedDeltaNet):
            node.group_tokens = tokens


class GatedDeltaNet(nnx.Module):
    def __init__(self, config: Qwen3_5Config, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.group_tokens = GROUP_TOKENS  # static; see set_delta_group_tokens
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.conv_kernel_size = config.linear_conv_kernel_dim
        h, hv = config.hidden_size, self.num_v_heads
        kw = dict(init_std=config.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.in_proj_qkv = dense(h, config.linear_conv_dim, ("embed", "linear_qkv"), **kw)
        self.in_proj_z = dense(h, config.linear_value_dim, ("embed", "linear_v"), **kw)
        self.in_proj_b = dense(h, hv, ("embed", "linear_heads"), **kw)
        self.in_proj_a = dense(h, hv, ("embed", "linear_heads"), **kw)
        self.conv1d = DepthwiseConv1d(config.linear_conv_dim, self.conv_kernel_size, param_dtype=param_dtype, rngs=rngs)
        self.dt_bias = logical_param(jnp.ones((hv,), param_dtype), ("linear_heads",))
        a = jax.random.uniform(rngs.params(), (hv,), jnp.float32, 0.01, 16.0)
        self.A_log = logical_param(jnp.log(a), ("linear_heads",))  # always fp32, as stored
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = dense(config.linear_value_dim, h, ("linear_v", "embed"), **kw)

    def __call__(self, x: jax.Array, segment_ids: jax.Array, reset: jax.Array,
                 cache: DeltaNetCache | None = None):
        """x [B,T,H]; reset from `segment_starts`. Returns (out [B,T,H], new cache or None)."""
        b, t, _ = x.shape
        hk, hv, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        real = segment_ids != 0
        qkv = self.in_proj_qkv(x) * real[..., None].astype(x.dtype)  # pads contribute nothing to the conv
        z = self.in_proj_z(x).reshape(b, t, hv, dv)
        beta_logits, a = self.in_proj_b(x), self.in_proj_a(x)

        window = (jnp.zeros((b, self.conv_kernel_size - 1, qkv.shape[-1]), qkv.dtype) if cache is None
                  else cache.conv)
        conv, x_ext, group_ext = segment_causal_conv(qkv, window, self.conv1d.weight[...], reset)
        conv = jax.nn.silu(conv).astype(qkv.dtype)
        key_dim = hk * dk
        q = conv[..., :key_dim].reshape(b, t, hk, dk)
        k = conv[..., key_dim:2 * key_dim].reshape(b, t, hk, dk)
        v = conv[..., 2 * key_dim:].reshape(b, t, hv, dv)

        f = stat_dtype(x.dtype)
        beta = jax.nn.sigmoid(beta_logits.astype(f))
        g = -jnp.exp(self.A_log[...].astype(f)) * jax.nn.softplus(a.astype(f) + self.dt_bias[...].astype(f))
        g = jnp.where(real[..., None], g, 0.0)  # pads: no decay ...
        q = l2_normalize(q.astype(f)) * dk ** -0.5
        k = l2_normalize(k.astype(f)) * real[..., None, None].astype(f)  # ... and no write
        # v head j reads q/k head j // (Hv/Hk): repeat-interleave, as HF.
        q, k = jnp.repeat(q, hv // hk, axis=2), jnp.repeat(k, hv // hk, axis=2)

        state = None if cache is None else cache.state
        if cache is not None and t == 1:
            o, state = delta_rule_recurrent(q, k, v, g, beta, reset=reset, initial_state=state)
        else:
            o, state = delta_rule_grouped(q, k, v, g, beta, reset=reset, initial_state=state,
                                          group_tokens=self.group_tokens)

        o = self.norm(o.astype(x.dtype), z).reshape(b, t, hv * dv)
        out = self.out_proj(o)
        if cache is None:
            return out, None
        new_window = next_conv_window(x_ext, group_ext, real, self.conv_kernel_size).astype(cache.conv.dtype)
        return out, DeltaNetCache(conv=new_window, state=state)
