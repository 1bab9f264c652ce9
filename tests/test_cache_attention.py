"""Cache-path attention over the filled prefix (model/attention.py::cache_attention) equals the
whole-buffer reference (segment_mask + grouped_attention): decode and multi-token calls, GQA,
buffers that blocks do not divide, padding and segments, and queries that see nothing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reterm_jax.model.attention import cache_attention, grouped_attention, segment_mask

CASES = [  # batch, queries, q heads, kv heads, buffer length, slots written before, key block
    (2, 5, 4, 2, 37, 20, 16),   # last block moved back into the buffer (37 = 2 x 16 + 5)
    (2, 1, 8, 1, 64, 63, 16),   # decode into the last slot, GQA 8
    (2, 7, 4, 4, 50, 0, 16),    # prefill of a fresh cache
    (2, 3, 4, 2, 40, 30, 512),  # one block larger than the buffer
    (1, 16, 2, 2, 96, 40, 8),   # many blocks
]


@pytest.mark.parametrize("b,t,nq,nkv,length,index,block", CASES)
def test_equals_whole_buffer_attention(b, t, nq, nkv, length, index, block):
    rng = np.random.default_rng(length + index)
    d = 8
    q = jnp.asarray(rng.normal(size=(b, t, nq, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, length, nkv, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, length, nkv, d)), jnp.float32)
    kv_seg = np.zeros((b, length), np.int32)
    kv_seg[:, :index + t] = 1
    kv_seg[0, :3] = 0                        # row 0: left padding
    if b > 1:
        kv_seg[1, index:index + t] = 2       # row 1: this call starts a new segment
        kv_seg[1, index + t - 1] = 0         # ... with a padding query, which sees nothing
    q_seg = jnp.asarray(kv_seg[:, index:index + t])
    kv_seg = jnp.asarray(kv_seg)
    slots = index + jnp.arange(t)
    ref = grouped_attention(q, k, v, segment_mask(q_seg, slots, kv_seg), 0.3)
    row_slots = jnp.broadcast_to(slots, (b, t))
    out = jax.jit(lambda *a: cache_attention(*a, 0.3, block=block))(q, k, v, q_seg, row_slots, kv_seg, index + t)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=1e-5)


def test_unwritten_slots_are_never_read():
    """Garbage (even NaN) past the filled prefix changes nothing: those blocks are not visited."""
    b, t, length, index = 1, 2, 64, 10
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.normal(size=(b, t, 2, 8)), jnp.float32)
    k = np.asarray(rng.normal(size=(b, length, 2, 8)), np.float32)
    v = k.copy()
    k[:, 16:], v[:, 16:] = np.nan, np.nan    # blocks of 16: only block 0 holds written slots
    kv_seg = np.zeros((b, length), np.int32)
    kv_seg[:, :index + t] = 1
    out = cache_attention(q, jnp.asarray(k), jnp.asarray(v), jnp.ones((b, t), jnp.int32), index + jnp.arange(t)[None],
                          jnp.asarray(kv_seg), index + t, 0.3, block=16)
    assert np.all(np.isfinite(np.asarray(out)))


def test_rows_at_their_own_slots():
    """Per-row write positions: each row's queries sit at its own slots; each row equals the
    reference computed for that row alone, and `filled` is the longest row's."""
    b, t, nq, nkv, length, block = 3, 2, 4, 2, 48, 16
    index = np.array([30, 4, 17])
    rng = np.random.default_rng(7)
    q = jnp.asarray(rng.normal(size=(b, t, nq, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, length, nkv, 8)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, length, nkv, 8)), jnp.float32)
    kv_seg = np.zeros((b, length), np.int32)
    for r, i in enumerate(index):
        kv_seg[r, :i + t] = 1
    q_seg = jnp.ones((b, t), jnp.int32)
    slots = jnp.asarray(index[:, None] + np.arange(t))
    out = cache_attention(q, k, v, q_seg, slots, jnp.asarray(kv_seg), int(index.max()) + t, 0.3, block=block)
    for r, i in enumerate(index):
        mask = segment_mask(q_seg[r:r + 1], i + jnp.arange(t), jnp.asarray(kv_seg[r:r + 1]))
        ref = grouped_attention(q[r:r + 1], k[r:r + 1], v[r:r + 1], mask, 0.3)
        np.testing.assert_allclose(np.asarray(out[r:r + 1]), np.asarray(ref), atol=1e-5, rtol=1e-5)
