"""A K/V cache stored in fp8 (`rollout.kv_cache_dtype=float8_e4m3fn`, `Sampler(kv_cache_dtype=)`).

Against the full-precision sampler on the same model: the written K/V slots are exactly its K/V
rounded to fp8 by ml_dtypes (clipped at fp8's largest finite value, never NaN); the DeltaNet
state and conv window keep their dtypes; the logits after a prefill and a decode stay close to
the full-precision cache's, and differ from them (the values really are rounded). The planner
counts one byte a K/V value, and a dtype name the sampler does not take is a UserError.
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from reterm_jax.model import Qwen3_5Config, Qwen3_5ForCausalLM
from reterm_jax.model.cache import AttentionCache, DeltaNetCache, init_cache, read_slots, storage_dtype, to_cache_dtype
from reterm_jax.rl.inference.sampler import Sampler
from reterm_jax.rl.inference.sampling import SamplingParams

FP8 = jnp.float8_e4m3fn
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [16, 17, 18], [19, 20, 21, 22, 23, 24, 25]]


def test_to_cache_dtype_clips_to_fp8s_range_and_rounds_like_ml_dtypes():
    x = np.array([1e4, -1e4, 448.0, 1.0, 0.3, -2.7e-3, 17.5, 0.0], np.float32)
    got = np.asarray(to_cache_dtype(jnp.asarray(x), FP8))
    want = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert np.isfinite(got.astype(np.float32)).all()
    assert to_cache_dtype(jnp.asarray(x), jnp.float32).dtype == jnp.float32  # same dtype: untouched


@pytest.fixture(scope="module")
def samplers():
    model = Qwen3_5ForCausalLM(Qwen3_5Config.tiny(), rngs=nnx.Rngs(5))
    kw = dict(stop_ids=(1,), pad_id=0, max_length=64, donate=False)
    return Sampler(model, **kw), Sampler(model, kv_cache_dtype=FP8, **kw)


def test_fp8_cache_holds_the_rounded_kv_and_stays_close(samplers):
    full, fp8 = samplers
    a, b = full.extend(full.init(3), PROMPTS), fp8.extend(fp8.init(3), PROMPTS)
    n_attn = 0
    for la, lb in zip(a.cache.layers, b.cache.layers):
        if isinstance(la, AttentionCache):
            n_attn += 1
            # fp8 values held as their bytes (model/cache.py BYTE_KV_DTYPE)
            assert lb.keys.dtype == lb.values.dtype == jnp.uint8 and la.keys.dtype == jnp.float32
            # the prompts' slots (each row's own length; other slots are unwritten zeros in both)
            for r, p in enumerate(PROMPTS):
                for want, got in ((la.keys, lb.keys), (la.values, lb.values)):
                    ref = np.clip(np.asarray(want[r, :len(p)]), -448, 448).astype(ml_dtypes.float8_e4m3fn)
                    assert np.asarray(got[r, :len(p)]).tobytes() == ref.tobytes()
                    back = np.asarray(read_slots(got, 0, len(p), jnp.float32))[r]  # what attention reads
                    np.testing.assert_array_equal(back, ref.astype(np.float32))
        else:
            assert isinstance(lb, DeltaNetCache)
            assert lb.state.dtype == jnp.float32 and lb.conv.dtype == la.conv.dtype
            np.testing.assert_array_equal(np.asarray(lb.conv), np.asarray(la.conv))  # before any attention
    assert n_attn > 0
    # Every row's next-token logits after the prefill, and after 6 greedy tokens decoded on the same
    # cache (each reads the rounded K/V of the prompt and of its own earlier tokens).
    _, gen = full.generate(a, jax.random.key(0), SamplingParams(0.0), 6)
    forced = [list(t) for t in gen.tokens]
    # at temperature 1 the forced tokens' log-probs are the model's (at 0 they would all be 0)
    a2, ga = full.generate(a, jax.random.key(0), SamplingParams(1.0), 6, forced=forced)
    b2, gb = fp8.generate(b, jax.random.key(0), SamplingParams(1.0), 6, forced=forced)
    for x, y in ((a.last_logits, b.last_logits), (a2.last_logits, b2.last_logits)):
        x, y = np.asarray(x), np.asarray(y)
        err = np.abs(x - y).max() / np.abs(x).max()
        assert 0 < err < 0.05, err  # seen: 0.9% and 1.3% of the largest logit
    lp_a, lp_b = np.concatenate(ga.logprobs), np.concatenate(gb.logprobs)
    assert len(lp_a) == 18 and 0 < np.abs(lp_a - lp_b).max() < 0.05  # seen: 0.0026 nats


def test_the_planner_counts_one_byte_a_kv_value():
    from reterm_jax.plan import rollout_cache_bytes
    cfg = Qwen3_5Config.qwen3_5_9b()
    bf16 = rollout_cache_bytes(cfg, 4, 262_144, 2, 4)
    fp8 = rollout_cache_bytes(cfg, 4, 262_144, 2, 4, kv_bytes=1)
    kv_bf16 = 8 * 2 * 262_144 * 1 * 256 * 2 * 4  # 8 attention layers, K and V, 1 head per device, 4 rows
    assert bf16 - fp8 == kv_bf16 / 2


def test_fp8_is_held_as_bytes_and_other_dtypes_as_themselves():
    assert storage_dtype(FP8) == jnp.uint8
    assert storage_dtype(jnp.bfloat16) == jnp.bfloat16 and storage_dtype(jnp.float32) == jnp.float32
    with pytest.raises(ValueError, match="float8_e5m2"):
        storage_dtype(jnp.float8_e5m2)
    c = init_cache(Qwen3_5Config.tiny(), 2, 16, jnp.bfloat16, FP8)
    kv = [l for l in c.layers if isinstance(l, AttentionCache)]
    assert kv and all(l.keys.dtype == l.values.dtype == jnp.uint8 for l in kv)
    assert all(l.conv.dtype == jnp.bfloat16 for l in c.layers if isinstance(l, DeltaNetCache))
