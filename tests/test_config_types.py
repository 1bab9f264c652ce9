"""The typed configs (reterm_jax/typed_config.py and the sections of train/, rl/grpo/ and
rl/evaluation/): one source of defaults, every field documented, and each bad value a one-line
UserError naming the field, from the same ConfigDict the command line overrides."""
from __future__ import annotations

import dataclasses
import os

import pytest

from reterm_jax.errors import UserError
from reterm_jax.presets import eval as eval_presets
from reterm_jax.presets import grpo as grpo_presets
from reterm_jax.presets import sft as sft_presets
from reterm_jax.rl.evaluation import config as eval_config
from reterm_jax.rl.grpo import config as grpo_config
from reterm_jax.rl.grpo.recovery import RecoveryConfig
from reterm_jax.train import config as train_config

TASKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tasks", "*")


def synthetic():
    """The tiny GRPO preset on the synthetic env (no task glob to satisfy)."""
    c = grpo_presets.get_config("tiny")
    c.env.kind = "synthetic"
    c.stream.overlong = "none"
    return c


def _set(c, path: str, value) -> None:
    node, *rest = path.split(".")
    target = c
    for part in [node, *rest][:-1]:
        target = target[part]
    target[path.split(".")[-1]] = value


@pytest.mark.parametrize("changes, error", [
    ({}, None),
    ({"rollout.top_k": 20}, "top_k=0 and top_p=1.0"),
    ({"rollout.param_dtype": "bf16"}, r"rollout.param_dtype='bf16'.*'bfloat16'"),
    ({"rollout.engine": "slots"}, "rollout.engine='slots': use one of lockstep, continuous"),
    ({"rollout.verify": "copy"}, "rollout.verify='copy': use one of in_place, clone"),
    ({"rollout.guide": "teacher"}, None),
    ({"rollout.guide": "oracle"}, r"rollout.guide='oracle'.*off, teacher"),
    ({"stream.guided_failure_weight": -0.5}, r"stream.guided_failure_weight=-0.5: must be >= 0"),
    ({"rollout.weights_sharding": "tensor"}, None),
    ({"rollout.weights_sharding": "replicated"}, r"rollout.weights_sharding='replicated'.*train, tensor"),
    ({"rollout.prefill_chunk": -1}, r"rollout.prefill_chunk=-1"),
    ({"rollout.kv_cache_dtype": "float8_e4m3fn"}, None),
    ({"rollout.kv_cache_dtype": "fp8"}, r"rollout.kv_cache_dtype='fp8'.*float8_e4m3fn"),
    ({"rollout.partial_credit": 0.5, "stream.signal": "reward"}, None),
    ({"rollout.partial_credit": 1.0, "stream.signal": "reward"},
     r"rollout.partial_credit=1.0: must be >= 0 and below env.threshold"),
    ({"rollout.partial_credit": 0.5, "stream.signal": "resolved"},
     r"partial_credit=0.5 with --config.stream.signal=resolved"),
    ({"rollout.group_size": 1}, r"--config.rollout.group_size=1: must be >= 2"),
    ({"bank.failures_from": "scripts"}, r"bank.failures_from='scripts': use one of policy, fault_commands"),
    ({"bank.retire_after": -1}, r"--config.bank.retire_after=-1: must be >= 0"),
    ({"stream.overlong": "cut"}, r"stream.overlong='cut'"),
    ({"loss.dual_clip": 0.5}, r"loss.dual_clip=0.5: must be > 1"),
    ({"stream.groups_per_step": 3, "train.micro_batches": 5}, r"12 rows must be a multiple of"),
    ({"init.sft_data": "/nonexistent/demos.jsonl"}, "init.sft_data=/nonexistent/demos.jsonl: no such file"),
    ({"init.sft_data": "org/hub-dataset"}, None),  # a datasets hub name is not checked on disk
    ({"optim.warmup_steps": -1}, r"--config.optim.warmup_steps=-1: must be >= 0"),
    ({"checkpoint.every": 0}, r"--config.checkpoint.every=0: must be >= 1"),
    ({"model.remat": "some"}, r"model.remat='some': use one of none, full"),
    ({"sandbox.runtime": "runsc"}, None),
    ({"sandbox.runtime": "kata"}, r"--config.sandbox.runtime=kata: sandbox runtime 'kata': use one of runc, runsc"),
])
def test_grpo_fields_are_checked_with_one_line_naming_the_field(changes, error):
    c = synthetic()
    for path, value in changes.items():
        _set(c, path, value)
    if error is None:
        assert isinstance(grpo_config.check_config(c), grpo_config.GRPOConfig)
    else:
        with pytest.raises(UserError, match=error) as e:
            grpo_config.check_config(c)
        assert "\n" not in str(e.value)


def test_docker_env_needs_tasks_and_trajectories_that_fit_a_row():
    c = grpo_presets.get_config("tiny")
    c.env.tasks = TASKS
    grpo_config.check_config(c, 1)
    c.rollout.max_tokens = c.train.seq_len + 1
    with pytest.raises(UserError, match="must fit one training row"):
        grpo_config.check_config(c, 1)
    c.env.tasks = "/nonexistent/*"
    with pytest.raises(UserError, match="env.tasks=/nonexistent/\\*: matches no task directory"):
        grpo_config.check_config(c, 1)


@pytest.mark.parametrize("presets, sections", [
    (sft_presets, train_config.SFT_SECTIONS), (grpo_presets, grpo_config.SECTIONS_TYPED),
    (eval_presets, eval_config.SECTIONS)])
def test_presets_hold_every_typed_field_with_a_doc(presets, sections):
    for preset in ("tiny", "qwen3_5_9b"):
        c = presets.get_config(preset)
        for name, kind in sections.items():
            assert set(c[name].keys()) == {f.name for f in dataclasses.fields(kind)}, name
            assert all(f.metadata.get("doc") for f in dataclasses.fields(kind)), name


def test_the_tiny_presets_take_the_typed_defaults_but_where_they_say_why():
    """One source of defaults: a tiny preset's value differs from its field's default only where the
    preset sets it on purpose (and says why there)."""
    def differing(c, sections):
        out = {}
        for name, kind in sections.items():
            for f in dataclasses.fields(kind):
                default = f.default_factory() if f.default is dataclasses.MISSING else f.default
                value = c[name][f.name]
                value = value.to_dict() if hasattr(value, "to_dict") else value
                if (list(value) if isinstance(value, tuple) else value) != \
                        (list(default) if isinstance(default, tuple) else default):
                    out[f"{name}.{f.name}"] = value
        return out
    assert set(differing(sft_presets.get_config("tiny"), train_config.SFT_SECTIONS)) == {"model.overrides", "data.path"}
    assert set(differing(grpo_presets.get_config("tiny"), grpo_config.SECTIONS_TYPED)) == {
        "model.overrides", "bank.failures_from", "optim.lr", "optim.warmup_steps", "optim.end_lr_ratio", "optim.b2",
        "checkpoint.every"}
    assert differing(eval_presets.get_config("tiny"), eval_config.SECTIONS) == {}
    # the producer's own config agrees with the run config where both have a default
    assert RecoveryConfig().engine == grpo_config.Rollout.engine == grpo_presets.get_config("tiny").rollout.engine
    assert eval_presets.get_config("tiny").limits.max_tokens == grpo_presets.get_config("tiny").rollout.max_tokens


def test_a_config_missing_or_adding_a_field_is_refused():
    c = synthetic()
    with c.unlocked():
        del c.rollout["engine"]
    with pytest.raises(UserError, match=r"config.rollout: missing \['engine'\]; build the config with"):
        grpo_config.check_config(c)
    c = synthetic()
    with c.unlocked():
        c.rollout.engines = "continuous"
    with pytest.raises(UserError, match=r"config.rollout: no field\(s\) \['engines'\]"):
        grpo_config.check_config(c)


@pytest.mark.parametrize("changes, error", [
    ({}, None),
    ({"data.path": ""}, "--config.data.path is empty"),
    ({"data.path": "./nothere.jsonl"}, "--config.data.path=./nothere.jsonl: no such file or directory"),
    ({"data.overlong": "cut"}, "--config.data.overlong='cut': use drop or truncate"),
    ({"train.batch_size": 3, "train.micro_batches": 2}, "train.batch_size=3 must be a multiple of"),
    ({"optim.mu_dtype": "fp8"}, r"--config.optim.mu_dtype='fp8': use one of"),
    ({"optim.decay_steps": 0}, r"--config.optim.decay_steps=0: must be >= 1"),
    ({"optim.decay_steps": 50}, None),
])
def test_sft_fields_are_checked(changes, error):
    c = sft_presets.get_config("tiny")
    for path, value in changes.items():
        _set(c, path, value)
    if error is None:
        assert train_config.check_config(c).optim.decay_steps == changes.get("optim.decay_steps")
    else:
        with pytest.raises(UserError, match=error):
            train_config.check_config(c)


@pytest.mark.parametrize("changes, error", [
    ({}, None),
    ({"policy": "random"}, r"--config.policy='random': use one of model, oracle, fault_then_oracle"),
    ({"slots": -1}, r"--config.slots=-1: must be >= 0"),
    ({"protocol.names": "pass@1,bogus"}, r"protocol.names='pass@1,bogus': unknown \['bogus'\]"),
    ({"limits.wall_clock_s": 0.0}, r"--config.limits.wall_clock_s=0.0: must be > 0"),
    ({"policy": "model", "model.checkpoint": "/nonexistent"}, r"model.checkpoint=/nonexistent: no such directory"),
])
def test_eval_fields_are_checked(changes, error):
    c = eval_presets.get_config("tiny")
    for path, value in changes.items():
        _set(c, path, value)
    if error is None:
        assert eval_config.check_config(c).run.policy == c.policy
    else:
        with pytest.raises(UserError, match=error):
            eval_config.check_config(c)
