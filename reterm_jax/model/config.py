"""Qwen3.5 text-decoder configuration: HF config.json in, validated frozen dataclass out.

Accepts both forms transformers writes: the multimodal checkpoint (`model_type` "qwen3_5",
text fields under `text_config`, `tie_word_embeddings` at the top level) and the flat text
config ("qwen3_5_text"). RoPE settings are read from `rope_parameters` (transformers 5) or
the legacy top-level `rope_theta` / `partial_rotary_factor` / `rope_scaling` keys.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
_LAYER_TYPES = (LINEAR_ATTENTION, FULL_ATTENTION)


@dataclasses.dataclass(frozen=True)
class Qwen3_5Config:
    vocab_size: int = 248320
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 32
    layer_types: tuple[str, ...] = ()  # empty -> 3 linear + 1 full, repeated
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 256
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_type: str = "default"
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    # M-RoPE: for text-only input the three position streams (t, h, w) are equal, so the
    # interleaved sections select identical frequencies and M-RoPE reduces to plain 1-D RoPE.
    # The fields are kept only so that export writes them back unchanged.
    mrope_section: tuple[int, ...] = (11, 11, 10)
    mrope_interleaved: bool = True
    max_position_embeddings: int = 262144
    hidden_act: str = "silu"
    attention_bias: bool = False
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    pad_token_id: int | None = 248044
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = 248044

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", default_layer_types(self.num_hidden_layers))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        self.validate()

    # ---- derived sizes -------------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:  # channels of in_proj_qkv / conv1d: q, k, v blocks
        return 2 * self.linear_key_dim + self.linear_value_dim

    def validate(self) -> None:
        def bad(field, value, why):
            raise ValueError(f"Qwen3_5Config.{field}={value!r}: {why}")

        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim",
                      "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                      "linear_value_head_dim", "linear_conv_kernel_dim"):
            if int(getattr(self, field)) <= 0:
                bad(field, getattr(self, field), "must be a positive integer")
        if self.rope_type != "default":
            bad("rope_type", self.rope_type, "only 'default' RoPE is implemented")
        if self.hidden_act != "silu":
            bad("hidden_act", self.hidden_act, "only 'silu' is implemented")
        if self.attention_bias:
            bad("attention_bias", self.attention_bias, "biased attention projections are not implemented")
        if self.attention_dropout:
            bad("attention_dropout", self.attention_dropout, "attention dropout is not implemented; use 0.0")
        unknown = sorted(set(self.layer_types) - set(_LAYER_TYPES))
        if unknown:
            bad("layer_types", unknown, f"unknown layer type(s); expected each in {_LAYER_TYPES}")
        if len(self.layer_types) != self.num_hidden_layers:
            bad("layer_types", f"<{len(self.layer_types)} entries>",
                f"must have num_hidden_layers={self.num_hidden_layers} entries")
        if self.num_attention_heads % self.num_key_value_heads:
            bad("num_key_value_heads", self.num_key_value_heads,
                f"must divide num_attention_heads={self.num_attention_heads}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            bad("linear_num_key_heads", self.linear_num_key_heads,
                f"must divide linear_num_value_heads={self.linear_num_value_heads}")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            bad("partial_rotary_factor", self.partial_rotary_factor, "must be in (0, 1]")
        if self.rotary_dim % 2:
            bad("partial_rotary_factor", self.partial_rotary_factor,
                f"head_dim * factor = {self.rotary_dim} must be even")
        if self.rms_norm_eps <= 0:
            bad("rms_norm_eps", self.rms_norm_eps, "must be positive")

    # ---- HF config.json --------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "Qwen3_5Config":
        """Builds from a transformers config dict, multimodal ("qwen3_5") or text ("qwen3_5_text")."""
        model_type = d.get("model_type", "qwen3_5_text")
        if model_type == "qwen3_5" or "text_config" in d:
            text = dict(d.get("text_config") or {})
            if "tie_word_embeddings" in d:  # the top-level flag is what transformers ties on
                text["tie_word_embeddings"] = d["tie_word_embeddings"]
        elif model_type == "qwen3_5_text":
            text = dict(d)
        else:
            raise ValueError(f"config model_type={model_type!r}: expected 'qwen3_5' or 'qwen3_5_text'")

        rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
        for key in ("rope_theta", "partial_rotary_factor"):
            if key not in rope and key in text:
                rope[key] = text[key]
        kw: dict[str, Any] = {}
        names = {f.name for f in dataclasses.fields(cls)}
        for name in names:
            if name in text:
                kw[name] = text[name]
        kw["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
        for key in ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"):
            if key in rope:
                kw[key] = rope[key]
        if text.get("layer_types") is None:
            kw.pop("layer_types", None)
            interval = text.get("full_attention_interval")
            if interval:
                n = text.get("num_hidden_layers", cls.num_hidden_layers)
                kw["layer_types"] = default_layer_types(n, interval)
        return cls(**kw)

    @classmethod
    def from_hf_dir(cls, path: str) -> "Qwen3_5Config":
        file = os.path.join(path, "config.json")
        if not os.path.exists(file):
            raise ValueError(f"no config.json in {path!r}: expected a HF Qwen3.5 checkpoint directory")
        with open(file) as fh:
            return cls.from_hf_dict(json.load(fh))

    def to_hf_text_dict(self) -> dict[str, Any]:
        """The flat transformers 5 text config ("qwen3_5_text")."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("rope_type", "rope_theta", "partial_rotary_factor", "mrope_section",
                    "mrope_interleaved"):
            d.pop(key)
        d["layer_types"] = list(self.layer_types)
        if isinstance(self.eos_token_id, tuple):
            d["eos_token_id"] = list(self.eos_token_id)
        d["rope_parameters"] = {
            "rope_type": self.rope_type, "rope_theta": self.rope_theta,
            "partial_rotary_factor": self.partial_rotary_factor,
            "mrope_section": list(self.mrope_section), "mrope_interleaved": self.mrope_interleaved,
        }
        d["model_type"] = "qwen3_5_text"
        return d

    # ---- presets -----------------------------------------------------------------------
    @classmethod
    def qwen3_5_9b(cls) -> "Qwen3_5Config":
        return cls()  # the defaults above are the 9B text config (docs/qwen3_5.md)

    @classmethod
    def tiny(cls, **overrides) -> "Qwen3_5Config":
        """A few-second CPU model with the 9B's structure (3 DeltaNet + 1 attention, GQA, Hv=2Hk)."""
        kw = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                  linear_value_head_dim=16, linear_conv_kernel_dim=4, rope_theta=10_000.0,
                  partial_rotary_factor=0.25, mrope_section=(1, 1, 0),
                  max_position_embeddings=4096, pad_token_id=0, eos_token_id=1)
        kw.update(overrides)
        return cls(**kw)


def default_layer_types(num_layers: int, full_attention_interval: int = 4) -> tuple[str, ...]:
    """transformers' default: every `interval`-th layer is full attention, the rest DeltaNet."""
    return tuple(FULL_ATTENTION if (i + 1) % full_attention_interval == 0 else LINEAR_ATTENTION
                 for i in range(num_layers))
