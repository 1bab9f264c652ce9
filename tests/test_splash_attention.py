"""Splash attention (model/splash_attention.py: JAX's Pallas TPU kernel, run by Pallas' interpreter
on the CPU) against the reference attention (attention.causal_block_attention): values and
gradients, fp32, lengths around and across the 128-token block, packed rows of 5 segments, left
padding, GQA ratios 1, 2, 4 and 8; the whole decoder; and the per-device form under a mesh."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reterm_jax.model.attention import causal_block_attention, resolve_attention_impl
from reterm_jax.model.splash_attention import splash_attention
from test_flash_attention import assert_model_matches_reference_attention, make_case
from xla_env import with_test_flags

TOL = 1e-5
CASES = [(1, "causal", 2), (129, "packed", 4), (300, "left_pad", 1), (600, "packed", 2), (200, "causal", 8)]


@pytest.mark.parametrize("t,layout,ratio", CASES)
def test_splash_equals_reference_values_and_gradients(t, layout, ratio):
    nkv = 1 if ratio == 8 else 2
    q, k, v, seg = make_case(t, nkv * ratio, nkv, layout, seed=t + ratio)
    scale = q.shape[-1] ** -0.5
    w = jnp.asarray(np.random.default_rng(9).normal(size=q.shape), jnp.float32)

    def loss(fn, q, k, v):  # padding queries are 0 in both; weight every output
        return jnp.sum(fn(q, k, v) * w)

    splash = lambda q, k, v: splash_attention(q, k, v, seg, scale)
    ref = lambda q, k, v: causal_block_attention(q, k, v, seg, scale)
    out = jax.jit(splash)(q, k, v)
    np.testing.assert_allclose(out, jax.jit(ref)(q, k, v), rtol=0, atol=TOL)
    assert not np.any(np.asarray(out)[np.asarray(seg) == 0])  # padding queries give exactly 0
    g_splash = jax.jit(jax.grad(lambda *a: loss(splash, *a), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", g_splash, g_ref):
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL, err_msg=f"d{name}")


def test_model_with_splash_equals_model_with_reference_attention():
    """The decoder with packed rows and padding: logits and the token loss's gradient agree."""
    assert_model_matches_reference_attention("splash", 250, 30)


def test_auto_picks_splash_only_on_tpu_with_lane_sized_heads():
    assert resolve_attention_impl("auto", 256, "tpu") == "splash"
    assert resolve_attention_impl("auto", 64, "tpu") == "flash"
    assert resolve_attention_impl("auto", 256, "cpu") == "flash"
    assert resolve_attention_impl("reference", 256, "tpu") == "reference"
    with pytest.raises(ValueError, match="model.attention_impl='bogus'"):
        resolve_attention_impl("bogus", 256)


SHARDED = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from reterm_jax.model.splash_attention import splash_attention
    from reterm_jax.model.attention import causal_block_attention
    from reterm_jax.parallel.mesh import make_mesh
    from test_flash_attention import assert_model_matches_reference_attention, make_case
    assert jax.device_count() == 4, jax.devices()
    q, k, v, seg = make_case(200, 4, 2, "packed", b=2, seed=1)
    mesh = make_mesh(fsdp=2, tensor=2)
    heads = NamedSharding(mesh, P("fsdp", None, "tensor", None))
    q, k, v = (jax.device_put(x, heads) for x in (q, k, v))
    seg = jax.device_put(seg, NamedSharding(mesh, P("fsdp", None)))
    fn = jax.jit(lambda q, k, v, s: splash_attention(q, k, v, s, 0.25))
    with jax.set_mesh(mesh):
        out = fn(q, k, v, seg)
        hlo = fn.lower(q, k, v, seg).compile().as_text()
    ref = causal_block_attention(*(np.asarray(x) for x in (q, k, v, seg)), 0.25)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=0, atol=1e-5)
    # each device ran its own row and kv head: nothing gathered, the output stays split
    assert out.sharding.spec == P("fsdp", None, "tensor", None), out.sharding
    assert {s.data.shape for s in out.addressable_shards} == {(1, 200, 2, 16)}
    assert "all-gather" not in hlo and "all-reduce" not in hlo
    print("ok")
""")


def test_splash_runs_per_device_under_a_mesh():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_test_flags("--xla_force_host_platform_device_count=4"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", SHARDED], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_splash_lowers_for_tpu_at_9b_head_sizes():
    """No TPU here: lower (not run) the compiled kernel's forward and backward for the TPU at the
    9B's attention shapes (16 query / 4 kv heads of 256, bf16, 8k tokens): three Mosaic kernels
    (forward, dq, dk/dv), so the block sizes and layouts are ones Mosaic accepts."""
    b, t, d = 1, 8192, 256
    q = jax.ShapeDtypeStruct((b, t, 16, d), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((b, t, 4, d), jnp.bfloat16)
    seg = jax.ShapeDtypeStruct((b, t), jnp.int32)

    def loss(q, k, v, s):
        return jnp.sum(splash_attention(q, k, v, s, d ** -0.5, interpret=False).astype(jnp.float32))
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv, seg).lower(lowering_platforms=("tpu",))
    assert lowered.as_text().count("tpu_custom_call") == 3
