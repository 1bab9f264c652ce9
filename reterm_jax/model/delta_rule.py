"""Gated delta rule (the Gated DeltaNet core), as pure functions in fp32 (fp64 for fp64 inputs).

Per batch row and head, with state S [dk, dv]:
    S <- exp(g_t) S;  S <- S + k_t ⊗ beta_t (v_t - Sᵀ k_t);  o_t = Sᵀ q_t

`delta_rule_recurrent` is the token-by-token scan (reference, and single-token decode);
`delta_rule_chunked` is the same function in the chunked WY/UT form used for prefill and
training. `reset[b, t]` zeroes the state before token t (packed-segment starts, left padding).

`delta_rule_grouped` runs the chunked form over groups of `group_tokens` tokens, carrying only
the state between groups, with a custom VJP that recomputes one group at a time. Memory: the chunked form builds
every chunk's [C, C] pieces (decays, masks, the (I + A)⁻¹ products) for the whole sequence at
once, and its gradient keeps them: ~105 KiB per token per layer at the 9B's per-device head count
(8 v heads, dk = dv = 128). Grouped, only one group's pieces exist at a time, forward or
backward; what is kept for the backward is the inputs and one state per group (dk·dv·4 bytes per
head per group). Measured numbers: docs/plan.md ("DeltaNet memory").
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# The state is a long-running sum; reduced-precision matmuls (TPU bf16 passes, GPU TF32)
# would drift from the fp32 reference, so every contraction here asks for full fp32.
_HIGHEST = lax.Precision.HIGHEST


def _einsum(spec, *operands):
    return jnp.einsum(spec, *operands, precision=_HIGHEST)


# Log decays below this are treated as exp(.) = 0. Why that is negligible: with u the
# solution of (I + A) u = rhs, T = (I + A)⁻¹ has, for i > j in one segment,
#     T_ij = -beta_i exp(G_i - G_j) k_iᵀ [prod_{j<m<i} (I - beta_m k_m k_mᵀ)] k_j,
# and for L2-normalised keys and 0 <= beta <= 2 every factor in brackets has norm <= 1, so
# |T_ij| <= 2 exp(G_i - G_j). Every quantity cut here (decay factors, entries of T and of
# the partial products building it, w_i ~ exp(G_i)) is thus below C * 4 * exp(-40) ~ 1e-15
# relative to the O(1) terms it is summed with: far below fp32's 6e-8 rounding, while
# exp(-40)² ~ 2e-35 is still a normal fp32 number, so products of two kept factors never
# produce a (slow, on the CPU) denormal.
_LOG_CUTOFF = -40.0
# The same argument in float64 (eps 1.1e-16, smallest normal 2e-308): exp(-80) ~ 2e-35 is far
# below its rounding and exp(-80)² is still normal. Only used when the inputs are float64
# (JAX_ENABLE_X64), which makes this module a float64 reference for its own fp32 form.
_LOG_CUTOFF_F64 = -80.0


# Diagonal blocks of (I + A) are inverted by forward substitution at this size; the
# off-diagonal blocks then follow by block forward substitution (matmuls).
_LEAF = 16


def _unit_lower_inverse(strictly_lower, keep):
    """(I + A)⁻¹ for A strictly lower triangular [..., C, C], with matmuls only.

    Entries (and partial products) where `keep` is False are set to 0: they are zero
    (other segment, above the diagonal) or below the cutoff (see _LOG_CUTOFF).
    """
    size = strictly_lower.shape[-1]
    leaf = min(_LEAF, size)
    pad = -size % leaf
    if pad:  # identity extension: the top-left block of the inverse is the answer
        widths = [(0, 0)] * (strictly_lower.ndim - 2) + [(0, pad), (0, pad)]
        strictly_lower = jnp.pad(strictly_lower, widths)
        keep = jnp.pad(keep, widths)
    blocks = (size + pad) // leaf
    keep = jnp.broadcast_to(keep, strictly_lower.shape)

    def diagonal_blocks(x):  # [..., n, n] -> [..., blocks, leaf, leaf]
        x = x.reshape(*x.shape[:-2], blocks, leaf, blocks, leaf)
        return jnp.moveaxis(jnp.diagonal(x, axis1=-4, axis2=-2), -1, -3)

    # Forward substitution inside each diagonal block, all blocks at once: row i of the
    # inverse is e_i - A[i, :i] X[:i]; rows >= i of X are still e_m and A[i, m >= i] = 0.
    a_leaf, keep_leaf = diagonal_blocks(strictly_lower), diagonal_blocks(keep)
    eye = jnp.eye(leaf, dtype=strictly_lower.dtype)
    x = jnp.broadcast_to(eye, a_leaf.shape)
    for i in range(1, leaf):
        row = eye[i] - _einsum("...j,...jk->...k", a_leaf[..., i, :], x)
        x = x.at[..., i, :].set(jnp.where(keep_leaf[..., i, :], row, 0.0))
    # Block forward substitution: X[b, :b] = -X[b, b] A[b, :b] X[:b, :b].
    inverse = x[..., 0, :, :]
    for b in range(1, blocks):
        rows = slice(b * leaf, (b + 1) * leaf)
        a_left = strictly_lower[..., rows, : b * leaf]
        keep_left = keep[..., rows, : b * leaf]
        partial = jnp.where(keep_left, _einsum("...ij,...jk->...ik", a_left, inverse), 0.0)
        left = jnp.where(keep_left, -_einsum("...ij,...jk->...ik", x[..., b, :, :], partial), 0.0)
        zeros = jnp.zeros((*inverse.shape[:-2], b * leaf, leaf), inverse.dtype)
        inverse = jnp.concatenate(
            [jnp.concatenate([inverse, zeros], axis=-1),
             jnp.concatenate([left, x[..., b, :, :]], axis=-1)], axis=-2)
    return inverse[..., :size, :size]


def _log_cutoff(dtype) -> float:
    return _LOG_CUTOFF_F64 if jnp.dtype(dtype) == jnp.float64 else _LOG_CUTOFF


def compute_dtype(*xs):
    """fp32 for bf16/fp16/fp32 inputs (the state is a long-running sum), fp64 for fp64 ones."""
    return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


def _prepare(q, k, v, g, beta, reset, initial_state):
    """Casts everything to the compute dtype and fills in the defaults (no resets, zero state)."""
    f = compute_dtype(q, k, v, g, beta)
    q, k, v, g, beta = (jnp.asarray(x, f) for x in (q, k, v, g, beta))
    batch, seq_len, heads, dk = k.shape
    dv = v.shape[-1]
    if reset is None:
        reset = jnp.zeros((batch, seq_len), bool)
    reset = jnp.asarray(reset, bool)
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, dk, dv), f)
    initial_state = jnp.asarray(initial_state, f)
    return q, k, v, g, beta, reset, initial_state


def delta_rule_recurrent(q, k, v, g, beta, *, reset=None, initial_state=None):
    """Token-by-token reference (lax.scan over T). Used for single-token decode too.

    q, k: [B, T, H, dk] (L2-normalised, q scaled by dk**-0.5, repeated to the v heads);
    v: [B, T, H, dv]; g (log decay <= 0), beta: [B, T, H]; reset: bool [B, T] or None;
    initial_state: [B, H, dk, dv] or None. Returns (o [B, T, H, dv], final_state), in the
    compute dtype (fp32, or fp64 for fp64 inputs).
    """
    q, k, v, g, beta, reset, state = _prepare(q, k, v, g, beta, reset, initial_state)

    def step(state, xs):
        q_t, k_t, v_t, g_t, beta_t, reset_t = xs  # [B, H, d] / [B, H] / [B]
        state = jnp.where(reset_t[:, None, None, None], 0.0, state)
        state = state * jnp.exp(g_t)[..., None, None]
        predicted = _einsum("bhkv,bhk->bhv", state, k_t)
        delta = (v_t - predicted) * beta_t[..., None]
        state = state + k_t[..., :, None] * delta[..., None, :]
        return state, _einsum("bhkv,bhk->bhv", state, q_t)

    time_major = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta, reset)]
    state, o = lax.scan(step, state, time_major)
    return jnp.moveaxis(o, 0, 1), state


def delta_rule_chunked(q, k, v, g, beta, *, reset=None, initial_state=None, chunk_size=64):
    """Chunked WY form; same function as the recurrence (same arguments and returns).

    Within a chunk of C tokens, with state S0 carried in, cumulative log decay G_i, the
    same-segment mask M_ij (i >= j, no reset in (j, i]) and Γ_i = exp(G_i)·[no reset in [0, i]]:
        u = (I + A)⁻¹ (beta v - beta Γ k S0),  A_ij = beta_i (k_i·k_j) exp(G_i - G_j) M_ij, j < i
        o_i = Γ_i S0ᵀ q_i + Σ_j exp(G_i - G_j) M_ij (q_i·k_j) u_j
        S_C = Γ_C S0 + Σ_j exp(G_C - G_j) M_Cj k_j u_jᵀ
    All [C, C] pieces are built for every chunk at once; only S0 -> S_C is a scan.
    """
    q, k, v, g, beta, reset, state = _prepare(q, k, v, g, beta, reset, initial_state)
    cutoff = _log_cutoff(q.dtype)
    batch, seq_len, heads, dk = k.shape
    dv = v.shape[-1]
    chunk = max(1, min(chunk_size, seq_len))  # a short prompt needs no padding up to 64
    pad = -seq_len % chunk
    num_chunks = (seq_len + pad) // chunk

    # Padded tokens have k = 0, beta = 0, g = 0 and no reset: they write nothing, decay
    # nothing and so leave the final state exactly as the last real token left it.
    def to_chunks(x):  # [B, T, H, ...] -> [B, H, N, C, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(batch, num_chunks, chunk, *x.shape[2:])
        return jnp.moveaxis(x, 3, 1)

    q, k, v, g, beta = map(to_chunks, (q, k, v, g, beta))
    reset = jnp.pad(reset, [(0, 0), (0, pad)]).reshape(batch, 1, num_chunks, chunk)

    # Segment index inside the chunk: 0 until the first reset, +1 at every reset.
    segment = jnp.cumsum(reset.astype(jnp.int32), axis=-1)  # [B, 1, N, C]
    carried = segment == 0  # the state carried into the chunk still reaches token i
    idx = jnp.arange(chunk)
    causal = idx[:, None] >= idx[None, :]
    same_segment = causal & (segment[..., :, None] == segment[..., None, :])  # [B, 1, N, C, C]

    log_decay = jnp.cumsum(g, axis=-1)  # [B, H, N, C], <= 0 and non-increasing
    pair = log_decay[..., :, None] - log_decay[..., None, :]
    # Decay factors below exp(_LOG_CUTOFF) are set to exactly 0 (see _LOG_CUTOFF): this keeps
    # fp32 denormals, which are slow on the CPU, out of every later product. Only the kept
    # differences (i >= j, same segment, hence <= 0) are exponentiated, so no inf reaches
    # values or gradients.
    keep = same_segment & (pair >= cutoff)  # [B, H, N, C, C], diagonal included
    pair_decay = jnp.where(keep, jnp.exp(jnp.where(keep, pair, 0.0)), 0.0)
    keep_carried = carried & (log_decay >= cutoff)
    carried_exp = jnp.exp(jnp.where(keep_carried, log_decay, 0.0))
    carried_decay = jnp.where(keep_carried, carried_exp, 0.0)  # Γ_i, [B, H, N, C]
    to_end = pair_decay[..., -1, :]  # exp(G_C - G_j) M_Cj, [B, H, N, C]

    k_beta = k * beta[..., None]
    strictly_lower = _einsum("bhnid,bhnjd->bhnij", k_beta, k) * pair_decay
    strictly_lower = jnp.where(idx[:, None] > idx[None, :], strictly_lower, 0.0)
    # T = (I + A)⁻¹, built with matmuls only (XLA CPU's batched triangular solve is slow).
    # v_beta and Γ k_beta share the matrix, so one product covers both right-hand sides.
    inverse = _unit_lower_inverse(strictly_lower, keep)
    rhs = jnp.concatenate([v * beta[..., None], k_beta * carried_decay[..., None]], axis=-1)
    solved = _einsum("bhnij,bhnjd->bhnid", inverse, rhs)
    u_local, w = solved[..., :dv], solved[..., dv:]  # u = u_local - w @ S0
    # |w_i| <= O(C) exp(G_i) (the bound on T below): zero it where Γ_i was cut to 0.
    w = jnp.where(keep_carried[..., None], w, 0.0)
    intra = _einsum("bhnid,bhnjd->bhnij", q, k) * pair_decay
    q_carried = q * carried_decay[..., None]
    k_to_end = k * to_end[..., None]
    chunk_carry = carried_decay[..., -1]  # Γ_C, [B, H, N]

    def step(state, xs):
        u_local, w, intra, q_carried, k_to_end, chunk_carry = xs
        u = u_local - _einsum("bhck,bhkv->bhcv", w, state)
        o = _einsum("bhck,bhkv->bhcv", q_carried, state) + _einsum("bhij,bhjv->bhiv", intra, u)
        state = state * chunk_carry[..., None, None] + _einsum("bhck,bhcv->bhkv", k_to_end, u)
        return state, o

    chunk_major = [jnp.moveaxis(x, 2, 0) for x in (u_local, w, intra, q_carried, k_to_end, chunk_carry)]
    state, o = lax.scan(step, state, chunk_major)  # o: [N, B, H, C, dv]
    o = jnp.moveaxis(o, 0, 2).reshape(batch, heads, num_chunks * chunk, dv)[:, :, :seq_len]
    return jnp.moveaxis(o, 1, 2), state


# Tokens per group in `delta_rule_grouped` (rounded up to a multiple of the chunk size); 0 = one
# group. The default of `model.delta_group_tokens`.
GROUP_TOKENS = 1024


def delta_rule_grouped(q, k, v, g, beta, *, reset=None, initial_state=None, chunk_size=64,
                       group_tokens=None):
    """`delta_rule_chunked` over groups of `group_tokens` tokens (same arguments and returns).

    A loop over the groups carries the state; one group's [C, C] pieces exist at a time. The
    gradient is a custom VJP: the forward keeps the inputs and the state entering each group,
    the backward runs the groups in reverse, recomputing each from its state (jax.vjp of the
    chunked form) and writing its input gradients in place. The gradient buffers are created
    from the incoming cotangent, so XLA cannot allocate them before this layer's backward starts
    (with a plain scan it hoisted every layer's at once). Sequences of at most one group are the
    chunked form itself. Tokens added to fill the last group are padding (k = 0, beta = 0, g = 0,
    no reset): they write and decay nothing. group_tokens None = GROUP_TOKENS; 0 = one group
    (the model sets it per layer from `model.delta_group_tokens`, model/deltanet.py).
    """
    group_tokens = GROUP_TOKENS if group_tokens is None else group_tokens
    seq_len = k.shape[1]
    chunk = max(1, min(chunk_size, seq_len))
    group = -(-max(group_tokens, chunk) // chunk) * chunk  # a multiple of the chunk size
    if group_tokens <= 0 or seq_len <= group:
        return delta_rule_chunked(q, k, v, g, beta, reset=reset, initial_state=initial_state,
                                  chunk_size=chunk_size)
    q, k, v, g, beta, reset, state = _prepare(q, k, v, g, beta, reset, initial_state)
    pad = -seq_len % group
    if pad:
        widths = lambda x: [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)
        q, k, v, g, beta, reset = (jnp.pad(x, widths(x)) for x in (q, k, v, g, beta, reset))
    o, state = _grouped(chunk, group, q, k, v, g, beta, reset, state)
    return o[:, :seq_len], state


def _group(x, i, group):
    return lax.dynamic_slice_in_dim(x, i * group, group, axis=1)


def _grouped_forward(chunk, group, q, k, v, g, beta, reset, state):
    """(o, final state, the state entering each group [G, B, H, dk, dv])."""
    def body(carry, i):
        state, o = carry
        xs = [_group(x, i, group) for x in (q, k, v, g, beta, reset)]
        o_i, new_state = delta_rule_chunked(*xs[:5], reset=xs[5], initial_state=state, chunk_size=chunk)
        return (new_state, lax.dynamic_update_slice_in_dim(o, o_i, i * group, axis=1)), state

    o = v * 0  # built from the inputs (not a constant XLA could allocate early)
    (state, o), entering = lax.scan(body, (state, o), jnp.arange(k.shape[1] // group))
    return o, state, entering


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _grouped(chunk, group, q, k, v, g, beta, reset, state):
    o, state, _ = _grouped_forward(chunk, group, q, k, v, g, beta, reset, state)
    return o, state


def _grouped_fwd(chunk, group, q, k, v, g, beta, reset, state):
    o, final, entering = _grouped_forward(chunk, group, q, k, v, g, beta, reset, state)
    return (o, final), (q, k, v, g, beta, reset, entering)


def _grouped_bwd(chunk, group, residuals, cotangents):
    q, k, v, g, beta, reset, entering = residuals
    d_o, d_state = cotangents
    zero = 0 * d_o.reshape(-1)[0]  # every buffer below depends on the cotangent: see the docstring
    grads = tuple(jnp.zeros(x.shape, x.dtype) + zero for x in (q, k, v, g, beta))

    def body(carry, i):
        d_state, grads = carry
        xs = [_group(x, i, group) for x in (q, k, v, g, beta)]
        reset_i = _group(reset, i, group)
        run = lambda q, k, v, g, beta, s: delta_rule_chunked(q, k, v, g, beta, reset=reset_i, initial_state=s,
                                                             chunk_size=chunk)
        _, pull = jax.vjp(run, *xs, entering[i])
        *d_xs, d_state = pull((_group(d_o, i, group), d_state))
        grads = tuple(lax.dynamic_update_slice_in_dim(acc, d, i * group, axis=1) for acc, d in zip(grads, d_xs))
        return (d_state, grads), None

    (d_state, grads), _ = lax.scan(body, (d_state, grads), jnp.arange(k.shape[1] // group), reverse=True)
    return (*grads, np.zeros(reset.shape, jax.dtypes.float0), d_state)


_grouped.defvjp(_grouped_fwd, _grouped_bwd)
