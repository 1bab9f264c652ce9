"""`rollout.weights_sharding` (where the samplers' weights lie on a mesh) and how `plan --compile`
models an accelerator's bf16 dots. The sampling itself, on 8 fake devices, is in
test_rl_sampler_sharded.py (same tokens, no weight split over fsdp, fewer gathers per step)."""
import pytest

from reterm_jax.parallel.rules import LOGICAL_RULES, PARAM_AXES, SAMPLER_WEIGHTS, logical_to_spec, sampler_weight_rules


def test_tensor_layout_keeps_only_the_tensor_axis_of_the_params():
    assert set(PARAM_AXES) <= set(LOGICAL_RULES)
    assert sampler_weight_rules("train") == LOGICAL_RULES
    rules = sampler_weight_rules("tensor")
    for name in PARAM_AXES:
        assert rules[name] == ("tensor" if LOGICAL_RULES[name] == "tensor" else None), name
    for name in set(LOGICAL_RULES) - set(PARAM_AXES):  # rows, lengths: the caches still split by them
        assert rules[name] == LOGICAL_RULES[name], name
    assert logical_to_spec(("embed", "mlp"), rules=rules) == logical_to_spec((None, "mlp"))
    assert "tensor" in SAMPLER_WEIGHTS and "train" in SAMPLER_WEIGHTS
    with pytest.raises(ValueError, match="weights_sharding='fsdp'"):
        sampler_weight_rules("fsdp")


def test_the_planner_counts_the_tensor_layouts_copy_whole_over_fsdp():
    import grpo as grpo_config
    from reterm_jax.parallel.presets import apply_preset
    from reterm_jax.plan import estimate, grpo_rollout_rows, train_view
    c = grpo_config.get_config("qwen3_5_9b")
    assert c.rollout.weights_sharding == "tensor"
    view = apply_preset(train_view(c), "fsdp_tp_block", 8)
    rows = grpo_rollout_rows(view)
    est = estimate(view, 8, rollout_batch=rows, rollout_len=c.rollout.cache_length)
    fsdp = est["mesh"]["fsdp"]
    assert fsdp > 1 and est["policy_copy"] == pytest.approx(est["params"] / 2 * fsdp)  # bf16 of fp32, whole over fsdp
    view.rollout.weights_sharding = "train"
    train = estimate(view, 8, rollout_batch=rows, rollout_len=c.rollout.cache_length)
    assert train["policy_copy"] == pytest.approx(est["params"] / 2)
    assert est["grpo_total"] - train["grpo_total"] == pytest.approx(est["policy_copy"] - train["policy_copy"])


def test_accelerator_model_flags_are_per_jaxlib_and_yield_to_the_users():
    from reterm_jax.plan import ACCELERATOR_MODEL_FLAGS, model_flags
    version = next(iter(ACCELERATOR_MODEL_FLAGS))
    fused = "--xla_cpu_experimental_ynn_fusion_type=dot"
    assert model_flags("train", "", version) == []  # the train step: XLA:CPU's defaults
    assert model_flags("rollout", "", version) == [fused, "--xla_disable_hlo_passes=while-loop-invariant-code-motion"]
    assert model_flags("rollout", "--xla_disable_hlo_passes=foo", version) == [fused]  # the user's option wins
    assert model_flags("rollout", "", "0.0.1") == []  # a jaxlib nobody measured: XLA:CPU's defaults
