"""model.attention_impl=cudnn: which batches cuDNN's fused kernel can express, and where it may run.

Its values and gradients against the flash kernel need an NVIDIA GPU with cuDNN (none in CI):
bench/gpu_attention_check.py does that and bench/gpu.sh runs it; docs/performance.md has the result.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from reterm_jax.model.attention import resolve_attention_impl
from reterm_jax.model.cudnn_attention import cudnn_expressible


@pytest.mark.parametrize("rows, ok", [
    ([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], True),     # right padding, a full row
    ([[0, 0, 0, 0, 0], [2, 2, 0, 0, 0]], True),     # an all-padding row; any one segment id
    ([[1, 1, 2, 2, 0], [1, 1, 1, 0, 0]], False),    # packed: two segments in a row
    ([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]], False),    # left padding
    ([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]], False),    # padding inside the segment
])
def test_expressible_means_one_segment_from_position_zero_then_padding(rows, ok):
    expressible, lengths = cudnn_expressible(jnp.asarray(rows, jnp.int32))
    assert bool(expressible) is ok
    np.testing.assert_array_equal(lengths, (np.asarray(rows) != 0).sum(1))


def test_cudnn_is_refused_with_the_reason_where_it_cannot_run():
    with pytest.raises(ValueError, match=r"attention_impl='cudnn': cuDNN attention needs an NVIDIA GPU \(JAX's backend is cpu\)"):
        resolve_attention_impl("cudnn", 256, "cpu")
    with pytest.raises(ValueError, match="bf16 or fp16 compute .*float32"):
        resolve_attention_impl("cudnn", 256, "gpu", jnp.float32)
    with pytest.raises(ValueError, match="head size <= 256"):
        resolve_attention_impl("cudnn", 512, "gpu", jnp.bfloat16)
    assert resolve_attention_impl("cudnn", 256, "gpu", jnp.bfloat16) == "cudnn"


def test_auto_picks_cudnn_on_gpus_under_half_precision_else_flash():
    assert resolve_attention_impl("auto", 256, "gpu", jnp.bfloat16) == "cudnn"
    assert resolve_attention_impl("auto", 128, "gpu", jnp.float16) == "cudnn"
    assert resolve_attention_impl("auto", 256, "gpu", jnp.float32) == "flash"
    assert resolve_attention_impl("auto", 512, "gpu", jnp.bfloat16) == "flash"
    assert resolve_attention_impl("auto", 256, "cpu", jnp.bfloat16) == "flash"


def test_a_cpu_run_asking_for_cudnn_fails_before_building_the_model():
    from configs import sft
    from reterm_jax.parallel.mesh import make_mesh
    from reterm_jax.train.state import abstract_params
    cfg = sft.get_config("tiny").model
    cfg.dtype, cfg.attention_impl = "bfloat16", "cudnn"
    with pytest.raises(ValueError, match="model.attention_impl='cudnn': cuDNN attention needs an NVIDIA GPU"):
        abstract_params(cfg, make_mesh())


def test_the_wrapper_pads_masks_and_falls_back_like_flash(monkeypatch):
    """cudnn_attention's own work (lengths, padding to SEQ_MULTIPLE, zeroed padding, the packed
    fallback), values and gradients, with cuDNN's kernel replaced by XLA's implementation of the
    same jax.nn.dot_product_attention call (cuDNN itself needs a GPU: bench/gpu_attention_check.py)."""
    import jax
    from reterm_jax.model import cudnn_attention as mod
    from reterm_jax.model.flash_attention import flash_attention

    xla = jax.nn.dot_product_attention
    monkeypatch.setattr(jax.nn, "dot_product_attention",
                        lambda *a, implementation=None, **kw: xla(*a, implementation="xla", **kw))
    rng = np.random.default_rng(0)
    t = 67  # not a multiple of SEQ_MULTIPLE
    q, k, v = (jnp.asarray(rng.normal(size=(3, t, n, 16)), jnp.float32) for n in (4, 2, 2))
    for seg in ([[1] * t, [1] * 30 + [0] * (t - 30), [0] * t],            # cuDNN's case
                [[1] * 20 + [2] * 40 + [0] * 7, [1] * t, [0] * t]):        # packed: flash
        seg = jnp.asarray(seg, jnp.int32)
        cot = jnp.asarray(rng.normal(size=q.shape), jnp.float32)

        def loss(fn):
            return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v, seg, 0.25) * cot), (0, 1, 2)))

        (want, want_g), (got, got_g) = loss(flash_attention)(q, k, v), loss(mod.cudnn_attention)(q, k, v)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        for a, b in zip(got_g, want_g):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
