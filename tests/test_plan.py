"""Memory planner (reterm_jax.plan) and sharding presets (reterm_jax.parallel.presets).

Fast tests check the exact parts (parameter / optimizer shards, rollout caches) against the real
objects; the slow one AOT-compiles a small multi-layer train step on 4 fake CPU devices and
compares the estimate with XLA's memory_analysis().
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from reterm_jax.model.cache import init_cache
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.parallel.presets import PRESETS, apply_preset
from reterm_jax.plan import compile_in_subprocess, estimate, plan_model_config, rollout_cache_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))
import sft as sft_config  # noqa: E402


def small_config(layers=8, seq_len=256, batch_size=4):
    c = sft_config.get_config("tiny")
    c.model.overrides.update(dict(num_hidden_layers=layers, layer_types=()))  # () -> 3 DeltaNet + 1 attention
    c.data.seq_len, c.train.batch_size = seq_len, batch_size
    return c


def test_presets_set_mesh_remat_and_micro_batches():
    c = sft_config.get_config("qwen3_5_9b")
    fsdp = apply_preset(c, "fsdp", 8)
    assert dict(fsdp.mesh) == dict(data=1, fsdp=-1, tensor=1) and fsdp.model.remat == "full"
    assert fsdp.train.micro_batches == 32 // 8  # one row per data-parallel device per micro-batch
    tp = apply_preset(c, "fsdp_tp", 8)
    assert tp.mesh.tensor == 4 and tp.train.micro_batches == 32 // 2
    assert c.mesh.tensor == 1  # the input config is not modified
    with pytest.raises(ValueError, match="choose one of"):
        apply_preset(c, "zero5", 8)
    with pytest.raises(ValueError, match="tensor=4"):
        apply_preset(c, "fsdp_tp", 6)
    block = apply_preset(c, "fsdp_tp_block", 8)
    assert dict(block.mesh) == dict(tp.mesh) and block.model.remat == "block"
    assert set(PRESETS) == {"fsdp", "fsdp_tp", "fsdp_tp_block"}


def test_9b_params_and_optimizer_are_exact():
    c = apply_preset(sft_config.get_config("qwen3_5_9b"), "fsdp", 8)
    est = estimate(c, 8)
    config = plan_model_config(c.model)
    assert config == Qwen3_5Config.qwen3_5_9b()
    from reterm_jax.model.hf_io import abstract_model
    from flax import nnx
    total = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.to_pure_dict(
        nnx.state(abstract_model(config), nnx.Param))))
    # every 9B param has a dim that 8 divides on its fsdp ("embed") axis except the 1-d ones
    # (norms, A_log, dt_bias: replicated, a few hundred thousand elements)
    assert total / 8 <= est["param_elems_per_device"] < total / 8 + 1e6
    assert est["params"] == pytest.approx(4 * est["param_elems_per_device"])
    assert est["optimizer"] == pytest.approx(2 * est["params"], abs=64)  # fp32 mu and nu (+ counters)
    tp = estimate(apply_preset(sft_config.get_config("qwen3_5_9b"), "fsdp_tp", 8), 8)
    # 32 devices' worth of sharding (fsdp 2 x tensor 4) only where both axes apply: 1/8 either way
    assert tp["params"] == pytest.approx(est["params"], rel=0.02)
    assert tp["rows_per_device"] == est["rows_per_device"] == 1
    assert tp["logits"] == pytest.approx(est["logits"] / 4)  # vocab split over tensor=4


def test_rollout_cache_matches_init_cache():
    config = Qwen3_5Config.tiny(num_hidden_layers=8)
    cache = init_cache(config, 3, 40, jnp.bfloat16)
    real = sum(x.nbytes for x in jax.tree.leaves(cache.layers)) + cache.segment_ids.nbytes
    assert rollout_cache_bytes(config, 3, 40, 2, 1) == real


def test_cli_prints_the_plan():
    out = subprocess.run(
        [sys.executable, "-m", "reterm_jax.plan", "--config=configs/sft.py:qwen3_5_9b", "--devices=16",
         "--preset=fsdp_tp", "--config.model.remat=attention", "--rollout_batch=8", "--rollout_len=4096",
         "--hbm=tpu_v5p"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert out.returncode == 0, out.stderr[-2000:]
    for word in ("parameters", "optimizer state", "gradients", "activations", "rollout caches", "of 95 GB HBM"):
        assert word in out.stdout, out.stdout
    assert "remat=attention" in out.stdout and "tensor" in out.stdout  # the typed field beat the preset's


@pytest.mark.slow
def test_estimate_agrees_with_xla_memory_analysis():
    """4 fake CPU devices, 8 layers (2 scanned blocks), fsdp. Arguments (params + Adam state +
    batch) are exact up to 1%; the total within a factor 2 (activations are a formula)."""
    c = apply_preset(small_config(layers=8, seq_len=512, batch_size=4), "fsdp", 4)
    est = estimate(c, 4)
    got = compile_in_subprocess(c, 4, scan_layers=True, timeout=1200)
    args_est = est["params"] + est["optimizer"] + est["batch"]
    assert got["argument_size_in_bytes"] == pytest.approx(args_est, rel=0.01)
    total = got["argument_size_in_bytes"] + got["output_size_in_bytes"] - got["alias_size_in_bytes"] \
        + got["temp_size_in_bytes"]
    assert 0.5 < total / est["train_total"] < 2.0, (total, est)


def test_grpo_configs_are_planned_with_their_own_rows():
    """A GRPO config: groups_per_step x group_size rows of train.seq_len, the published policy
    copy (bf16 on the 9B preset), the reference only when kl_coef > 0, and the samplers' caches:
    each worker's rows over data x fsdp, K/V heads over tensor."""
    import grpo as grpo_config
    from reterm_jax.plan import grpo_rollout_rows, train_view
    c = grpo_config.get_config("qwen3_5_9b")
    view = apply_preset(train_view(c), "fsdp_tp", 8)
    assert view.train.batch_size == c.stream.groups_per_step * c.rollout.group_size == 128
    assert view.data.seq_len == c.train.seq_len
    rows = grpo_rollout_rows(view)
    assert rows == c.rollout.workers * max(c.rollout.group_size, c.rollout.collect_batch)
    est = estimate(view, 8, rollout_batch=rows, rollout_len=c.rollout.cache_length)
    assert c.rollout.param_dtype == "bfloat16" and c.model.param_dtype == "float32"
    assert c.rollout.weights_sharding == "tensor"  # the published bf16 copy is whole over fsdp
    assert est["policy_copy"] == est["params"] / 2 * est["mesh"]["fsdp"] and est["reference"] == 0
    mesh = est["mesh"]
    per_worker = rows // c.rollout.workers
    assert per_worker % (mesh["data"] * mesh["fsdp"]) == 0
    assert est["rollout_cache"] == c.rollout.workers * rollout_cache_bytes(
        plan_model_config(c.model), per_worker // (mesh["data"] * mesh["fsdp"]), c.rollout.cache_length, 2,
        mesh["tensor"], kv_bytes=1)  # the preset's K/V in float8_e4m3fn
    assert est["grpo_total"] == pytest.approx(est["train_total"] + est["policy_copy"] + est["rollout_cache"])
    with view.unlocked():
        view.loss.kl_coef = 0.1
    assert estimate(view, 8, rollout_batch=rows, rollout_len=c.rollout.cache_length)["reference"] == est["params"]


def test_compiled_rollout_worker_keeps_its_cache_split():
    """One tiny GRPO worker's sampler compiled on 8 fake devices (fsdp=4, tensor=2): the cache per
    device is what the planner's formula says (plus the sampler's token record and logits), and
    no collective in the decode loop moves it."""
    import grpo as grpo_config
    from reterm_jax.plan import train_view
    from reterm_jax.plan_rollout import worker_rows
    c = train_view(grpo_config.get_config("tiny"))
    c.mesh.fsdp, c.mesh.tensor = 4, 2
    got = compile_in_subprocess(c, 8, what="rollout", timeout=600)
    rows = worker_rows(c)
    assert got["rows"] == rows == 4 and got["mesh"] == {"data": 1, "fsdp": 4, "tensor": 2}
    formula = rollout_cache_bytes(plan_model_config(c.model), rows // 4, c.rollout.cache_length, 4, 2)
    assert 1.0 <= got["cache_bytes"] / formula < 1.2, (got["cache_bytes"], formula)
    assert got["kv_shard"][0] == 1 and got["cache_collectives"] == [] and got["decode_collectives"] > 0
    assert got["decode"]["alias_size_in_bytes"] >= got["cache_bytes"]  # decoded in place (donated)


def test_cli_plans_a_grpo_config_and_says_what_to_change():
    out = subprocess.run(
        [sys.executable, "-m", "reterm_jax.plan", "--config=configs/grpo.py:qwen3_5_9b", "--devices=8",
         "--preset=fsdp_tp", "--config.rollout.kv_cache_dtype="], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert out.returncode == 0, out.stderr[-2000:]
    for word in ("GRPO total", "policy copy", "rollout caches", "32 rows x 262144 tokens", "K/V in bfloat16",
                 "does not fit:", "--config.rollout.kv_cache_dtype=float8_e4m3fn ("):
        assert word in out.stdout, out.stdout


def test_saved_activations_follow_remat_and_sequence_parallelism():
    """Saved layer inputs: one per layer (full) or per 4-layer block plus one block's (block),
    split over tensor=4 by the sequence-parallel rule."""
    c = sft_config.get_config("qwen3_5_9b")
    c.data.seq_len = 8192
    full = estimate(apply_preset(c, "fsdp_tp", 8), 8)
    block = estimate(apply_preset(c, "fsdp_tp_block", 8), 8)
    layer_in = 8192 * 4096 * 2 / 4  # one row of bf16 hidden states, its length split 4 ways
    assert full["saved"] == pytest.approx(32 * layer_in)
    assert block["saved"] == pytest.approx((32 // 4 + 4) * layer_in)
    assert block["working"] == full["working"]


def test_fields_the_user_set_win_over_the_preset():
    c = sft_config.get_config("qwen3_5_9b")
    c.model.remat, c.mesh.tensor, c.train.micro_batches = "attention", 2, 3
    kept = apply_preset(c, "fsdp_tp", 8, keep={"model.remat"})
    assert kept.model.remat == "attention" and kept.mesh.tensor == 4 and kept.train.micro_batches == 16
    kept = apply_preset(c, "fsdp_tp", 8, keep={"mesh.tensor", "train.micro_batches"})
    assert kept.model.remat == "full" and kept.mesh.tensor == 2 and kept.train.micro_batches == 3
    kept = apply_preset(c, "fsdp_tp", 8, keep={"mesh.tensor"})
    assert kept.train.micro_batches == 32 // 4  # derived from the kept mesh: 4 data-parallel devices
