"""The gated delta rule: chunked == recurrent == a numpy loop == transformers, resets, grads."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from reterm_jax.model import delta_rule

ATOL = 1e-5
# Jitted once per shape: eager dispatch compiles every small op separately and is slower here.
delta_rule_chunked = jax.jit(delta_rule.delta_rule_chunked, static_argnames="chunk_size")
delta_rule_recurrent = jax.jit(delta_rule.delta_rule_recurrent)
# Groups of 32 tokens (two 16-token chunks): every sequence below spans several groups, some
# with a partial last group.
delta_rule_grouped = jax.jit(delta_rule.delta_rule_grouped, static_argnames=("chunk_size", "group_tokens"))


def _l2norm(x):  # same formula (and eps) as HF/FLA's l2norm
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def make_inputs(seed, batch, seq_len, heads, dk=8, dv=16, *, log_decay_scale=1.0):
    """Inputs as the DeltaNet layer hands them over: normalised q/k, q scaled, g <= 0."""
    rng = np.random.default_rng(seed)
    q = _l2norm(rng.normal(size=(batch, seq_len, heads, dk))) * dk**-0.5
    k = _l2norm(rng.normal(size=(batch, seq_len, heads, dk)))
    v = rng.normal(size=(batch, seq_len, heads, dv))
    g = -rng.uniform(0.0, log_decay_scale, size=(batch, seq_len, heads))
    beta = rng.uniform(0.05, 0.95, size=(batch, seq_len, heads))
    state = rng.normal(size=(batch, heads, dk, dv))
    f32 = lambda x: x.astype(np.float32)
    return tuple(map(f32, (q, k, v, g, beta))), f32(state)


def numpy_reference(q, k, v, g, beta, reset=None, initial_state=None):
    """The recurrence exactly as written in the spec, one token at a time, in float64."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    batch, seq_len, heads, dk = k.shape
    state = np.zeros((batch, heads, dk, v.shape[-1]))
    if initial_state is not None:
        state = np.array(initial_state, np.float64)
    out = np.zeros(v.shape)
    for t in range(seq_len):
        for b in range(batch):
            if reset is not None and reset[b, t]:
                state[b] = 0.0
            for h in range(heads):
                s = state[b, h] * np.exp(g[b, t, h])
                s = s + np.outer(k[b, t, h], beta[b, t, h] * (v[b, t, h] - s.T @ k[b, t, h]))
                state[b, h] = s
                out[b, t, h] = s.T @ q[b, t, h]
    return out, state


@pytest.mark.parametrize("seq_len", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("variant", ["defaults", "state_and_resets"])
def test_matches_numpy_reference(seq_len, variant):
    """`defaults` passes reset=None, initial_state=None; test_matches_transformers covers a state alone."""
    (q, k, v, g, beta), s0 = make_inputs(seq_len, 2, seq_len, 2)
    state = reset = None
    if variant == "state_and_resets":
        state = s0
        reset = np.random.default_rng(1).uniform(size=(2, seq_len)) < 0.04
        reset[1, 0] = True  # row 1 must ignore its initial state
    ref_o, ref_s = numpy_reference(q, k, v, g, beta, reset, state)
    results = {"recurrent": delta_rule_recurrent(q, k, v, g, beta, reset=reset, initial_state=state)}
    for chunk_size in (64, 16):
        results[f"chunked{chunk_size}"] = delta_rule_chunked(
            q, k, v, g, beta, reset=reset, initial_state=state, chunk_size=chunk_size
        )
    results["grouped"] = delta_rule_grouped(q, k, v, g, beta, reset=reset, initial_state=state,
                                            chunk_size=16, group_tokens=32)
    for name, (o, s) in results.items():
        assert o.dtype == jnp.float32 and s.dtype == jnp.float32, name
        assert o.shape == v.shape and s.shape == s0.shape, name
        np.testing.assert_allclose(o, ref_o, atol=ATOL, err_msg=name)
        np.testing.assert_allclose(s, ref_s, atol=ATOL, err_msg=name)


def test_matches_transformers():
    """HF takes raw q/k with use_qk_l2norm_in_kernel and scales q itself; Hk=2 heads serve Hv=4."""
    rng = np.random.default_rng(7)
    batch, seq_len, hk, hv, dk, dv = 2, 100, 2, 4, 8, 16
    q_raw, k_raw = (rng.normal(size=(batch, seq_len, hk, dk)).astype(np.float32) for _ in range(2))
    (_, _, v, g, beta), s0 = make_inputs(3, batch, seq_len, hv, dk, dv)
    torch_args = [torch.from_numpy(x) for x in (q_raw, k_raw, v, g, beta)]
    # __wrapped__ is the reference torch code, without the hub-kernel dispatch around it.
    hf_chunk = getattr(hf.torch_chunk_gated_delta_rule, "__wrapped__", hf.torch_chunk_gated_delta_rule)
    hf_rec = getattr(hf.torch_recurrent_gated_delta_rule, "__wrapped__", hf.torch_recurrent_gated_delta_rule)
    common = dict(initial_state=torch.from_numpy(s0), output_final_state=True, use_qk_l2norm_in_kernel=True)
    hf_results = [hf_chunk(*torch_args, chunk_size=64, **common), hf_rec(*torch_args, **common)]

    repeat = lambda x: np.repeat(x, hv // hk, axis=2)  # repeat-interleave, as HF does
    q, k = repeat(_l2norm(q_raw) * dk**-0.5), repeat(_l2norm(k_raw))
    ours = [
        delta_rule_chunked(q, k, v, g, beta, initial_state=s0),
        delta_rule_recurrent(q, k, v, g, beta, initial_state=s0),
    ]
    for (o, s) in ours:
        for (hf_o, hf_s) in hf_results:
            np.testing.assert_allclose(o, hf_o.numpy(), atol=ATOL)
            np.testing.assert_allclose(s, hf_s.numpy(), atol=ATOL)


# Segment lengths per row. Row 0 (C=64) has starts at 10 (mid-chunk), 64 (on a chunk boundary)
# and 134, with 64..134 spanning a boundary; row 1 has a 1-token segment and 73..160 spans 128.
SEGMENTS = [[10, 54, 70, 26], [33, 1, 39, 87]]


@pytest.mark.parametrize("fn", ["recurrent", "chunked64", "chunked16", "grouped"])
def test_reset_equals_separate_sequences(fn):
    run = {
        "recurrent": delta_rule_recurrent,
        "chunked64": lambda *a, **kw: delta_rule_chunked(*a, chunk_size=64, **kw),
        "chunked16": lambda *a, **kw: delta_rule_chunked(*a, chunk_size=16, **kw),
        "grouped": lambda *a, **kw: delta_rule_grouped(*a, chunk_size=16, group_tokens=32, **kw),
    }[fn]
    seq_len = sum(SEGMENTS[0])
    (q, k, v, g, beta), s0 = make_inputs(11, 2, seq_len, 2)
    reset = np.zeros((2, seq_len), bool)
    for row, lengths in enumerate(SEGMENTS):
        reset[row, np.cumsum([0] + lengths[:-1])] = True
    reset[0, 0] = False  # row 0 starts from s0, row 1 has a reset at t=0 and must ignore s0
    o, s = run(q, k, v, g, beta, reset=reset, initial_state=s0)

    for row, lengths in enumerate(SEGMENTS):
        start = 0
        for i, length in enumerate(lengths):
            sl = slice(start, start + length)
            seg = tuple(x[row : row + 1, sl] for x in (q, k, v, g, beta))
            seg_state = s0[row : row + 1] if (row == 0 and i == 0) else None
            seg_o, seg_s = numpy_reference(*seg, initial_state=seg_state)
            np.testing.assert_allclose(o[row, sl], seg_o[0], atol=ATOL, err_msg=f"row {row} seg {i}")
            start += length
        np.testing.assert_allclose(s[row], seg_s[0], atol=ATOL, err_msg=f"row {row} final state")


def test_reset_blocks_intra_chunk_leak():
    """Changing tokens before a mid-chunk reset must not change anything after it."""
    (q, k, v, g, beta), s0 = make_inputs(5, 1, 40, 2)
    reset = np.zeros((1, 40), bool)
    reset[0, 17] = True
    v2 = v.copy()
    v2[:, :17] += 5.0
    a = delta_rule_chunked(q, k, v, g, beta, reset=reset, initial_state=s0, chunk_size=32)
    b = delta_rule_chunked(q, k, v2, g, beta, reset=reset, initial_state=2 * s0, chunk_size=32)
    np.testing.assert_allclose(np.asarray(a[0])[:, 17:], np.asarray(b[0])[:, 17:], atol=1e-6)
    np.testing.assert_allclose(a[1], b[1], atol=1e-6)
    assert not np.allclose(np.asarray(a[0])[:, :17], np.asarray(b[0])[:, :17])


def test_continuation(split=70):
    """Prefill [0:T1] then continue from its state == one pass; chunked prefill + recurrent decode too.

    T1 = 70 ends mid-chunk (C=32), so the first call pads and the second starts mid-"chunk grid"."""
    (q, k, v, g, beta), s0 = make_inputs(13, 2, 150, 2)
    reset = np.zeros((2, 150), bool)
    reset[1, 90] = True
    xs = (q, k, v, g, beta)
    full_o, full_s = delta_rule_chunked(*xs, reset=reset, initial_state=s0, chunk_size=32)
    head = tuple(x[:, :split] for x in xs)
    tail = tuple(x[:, split:] for x in xs)
    o1, s1 = delta_rule_chunked(*head, reset=reset[:, :split], initial_state=s0, chunk_size=32)
    for second in (delta_rule_chunked, delta_rule_recurrent):
        o2, s2 = second(*tail, reset=reset[:, split:], initial_state=s1)
        np.testing.assert_allclose(np.concatenate([o1, o2], axis=1), full_o, atol=ATOL)
        np.testing.assert_allclose(s2, full_s, atol=ATOL)


def test_low_precision_inputs_compute_in_fp32():
    (q, k, v, g, beta), s0 = make_inputs(17, 1, 30, 2)
    low = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, g, beta)]
    up = [x.astype(jnp.float32) for x in low]
    for fn in (delta_rule_chunked, delta_rule_recurrent):
        o, s = fn(*low, initial_state=s0)
        ref_o, ref_s = numpy_reference(*up, initial_state=s0)
        assert o.dtype == jnp.float32 and s.dtype == jnp.float32
        np.testing.assert_allclose(o, ref_o, atol=ATOL)
        np.testing.assert_allclose(s, ref_s, atol=ATOL)


def test_gradients_finite_and_equal():
    """Includes very strong decays (exp underflow) and resets; grads through jit."""
    (q, k, v, g, beta), s0 = make_inputs(19, 2, 70, 2, log_decay_scale=3.0)
    g[0, 5:9] = -200.0  # cumulative log decay far below exp's fp32 range inside one chunk
    g[1, 40] = 0.0
    reset = np.zeros((2, 70), bool)
    reset[0, 20] = reset[1, 0] = reset[1, 33] = True
    w_o = np.random.default_rng(0).normal(size=v.shape).astype(np.float32)
    w_s = np.random.default_rng(1).normal(size=s0.shape).astype(np.float32)

    def loss(fn, *args, **kwargs):
        o, s = fn(*args, reset=reset, **kwargs)
        return jnp.sum(o * w_o) + jnp.sum(s * w_s)

    def grads(fn):
        wrapped = lambda q, k, v, g, beta, s0: loss(fn, q, k, v, g, beta, initial_state=s0)
        return jax.jit(jax.grad(wrapped, argnums=range(6)))(q, k, v, g, beta, s0)

    chunked = grads(lambda *a, **kw: delta_rule_chunked(*a, chunk_size=16, **kw))
    recurrent = grads(delta_rule_recurrent)
    grouped = grads(lambda *a, **kw: delta_rule_grouped(*a, chunk_size=16, group_tokens=32, **kw))
    names = ["q", "k", "v", "g", "beta", "initial_state"]
    for name, gc, gr, gg in zip(names, chunked, recurrent, grouped):
        assert np.all(np.isfinite(gc)) and np.all(np.isfinite(gr)), name
        np.testing.assert_allclose(gc, gr, atol=1e-4, rtol=1e-4, err_msg=name)
        np.testing.assert_allclose(gg, gc, atol=1e-6, rtol=1e-6, err_msg=f"grouped {name}")
    assert np.abs(chunked[5][1]).max() == 0.0  # row 1 resets at t=0: s0 has no influence
    assert np.abs(chunked[5][0]).max() > 0.0


def test_grouped_is_the_chunked_form_in_groups():
    """Groups that split chunks' grid exactly: same values as one chunked pass (fp32 rounding only),
    for T below, at, and above a group, a partial last group and resets on group boundaries."""
    for seq_len in (31, 32, 33, 96, 150):
        (q, k, v, g, beta), s0 = make_inputs(seq_len + 100, 2, seq_len, 2)
        reset = np.zeros((2, seq_len), bool)
        reset[0, [t for t in (32, 64, 100) if t < seq_len]] = True
        full = delta_rule_chunked(q, k, v, g, beta, reset=reset, initial_state=s0, chunk_size=16)
        grouped = delta_rule_grouped(q, k, v, g, beta, reset=reset, initial_state=s0, chunk_size=16, group_tokens=32)
        for a, b in zip(full, grouped):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(b, a, atol=1e-6, rtol=1e-6)
