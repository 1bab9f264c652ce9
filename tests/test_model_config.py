"""Qwen3_5Config: HF dict forms, validation messages, and the 9B parameter count."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3_5Config as HFConfig
from transformers import Qwen3_5ForCausalLM as HFCausalLM
from transformers import Qwen3_5TextConfig as HFTextConfig

from hf_reference import TEXT_VARIANTS, text_config
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM


@pytest.mark.parametrize("variant", list(TEXT_VARIANTS))
def test_flat_and_nested_forms_agree(variant):
    text = text_config(variant).to_dict()
    nested = HFConfig(text_config=text, tie_word_embeddings=text["tie_word_embeddings"]).to_dict()
    flat_cfg, nested_cfg = Qwen3_5Config.from_hf_dict(text), Qwen3_5Config.from_hf_dict(nested)
    assert flat_cfg == nested_cfg
    assert flat_cfg.layer_types == tuple(TEXT_VARIANTS[variant]["layer_types"])
    assert flat_cfg.partial_rotary_factor == TEXT_VARIANTS[variant]["partial_rotary_factor"]
    assert Qwen3_5Config.from_hf_dict(flat_cfg.to_hf_text_dict()) == flat_cfg


def test_top_level_tie_flag_wins_in_nested_form():
    text = text_config("gqa2_conv4_untied").to_dict()
    nested = HFConfig(text_config=text, tie_word_embeddings=True).to_dict()
    assert Qwen3_5Config.from_hf_dict(nested).tie_word_embeddings is True


def test_legacy_rope_keys_and_default_layer_types():
    d = {"model_type": "qwen3_5_text", "num_hidden_layers": 8, "rope_theta": 5e6,
         "partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "default",
                                                        "mrope_section": [11, 11, 10]}}
    cfg = Qwen3_5Config.from_hf_dict(d)
    assert (cfg.rope_theta, cfg.partial_rotary_factor) == (5e6, 0.5)
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) + \
        ("linear_attention",) * 3 + ("full_attention",)


@pytest.mark.parametrize("field, value, overrides", [
    ("rope_type", "yarn", {}),
    ("hidden_act", "gelu", {}),
    ("attention_bias", True, {}),
    ("layer_types", ("linear_attention", "sliding_attention", "linear_attention", "full_attention"), {}),
    ("layer_types", ("linear_attention",) * 3, {}),
    ("num_key_value_heads", 3, {}),
    ("linear_num_key_heads", 3, {}),
    ("partial_rotary_factor", 1.5, {}),
])
def test_bad_values_name_the_field(field, value, overrides):
    with pytest.raises(ValueError, match=field):
        Qwen3_5Config.tiny(**{field: value}, **overrides)


def test_bad_values_from_hf_dict():
    text = text_config("gqa2_conv4_untied").to_dict()
    text["rope_parameters"] = dict(text["rope_parameters"], rope_type="linear", factor=2.0)
    with pytest.raises(ValueError, match="rope_type"):
        Qwen3_5Config.from_hf_dict(text)
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        Qwen3_5Config.from_hf_dict({"model_type": "gpt2"})
    for key, value in (("mlp_bias", True), ("use_sliding_window", True), ("pretraining_tp", 2)):
        with pytest.raises(ValueError, match=key):
            Qwen3_5Config.from_hf_dict({"model_type": "llama", key: value})
    assert Qwen3_5Config.from_hf_dict({"model_type": "llama"}).num_key_value_heads == 32  # LlamaConfig's defaults




def test_9b_parameter_count_equals_transformers():
    cfg = Qwen3_5Config.qwen3_5_9b()
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == \
        (248320, 4096, 12288, 32)
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == list(range(3, 32, 4))
    abstract = nnx.eval_shape(lambda: Qwen3_5ForCausalLM(cfg))
    ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))

    hf_cfg = HFTextConfig(**{k: v for k, v in cfg.to_hf_text_dict().items() if k != "model_type"})
    with torch.device("meta"):
        hf = HFCausalLM(hf_cfg)
    theirs = sum(p.numel() for p in hf.parameters())
    assert ours == theirs, (ours, theirs)


def test_parameter_dtypes_and_axis_names():
    import jax.numpy as jnp
    model = nnx.eval_shape(lambda: Qwen3_5ForCausalLM(Qwen3_5Config.tiny(), param_dtype=jnp.bfloat16))
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name = ".".join(map(str, path))
        fp32 = name.endswith("linear_attn.A_log") or name.endswith("linear_attn.norm.weight")
        assert var.get_value().dtype == (jnp.float32 if fp32 else jnp.bfloat16), name
        axes = var.get_metadata().get("out_sharding")
        assert axes is not None and len(axes) == len(var.get_value().shape), name
    assert dataclasses.is_dataclass(Qwen3_5Config.tiny())
