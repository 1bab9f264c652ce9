"""Decoder configuration: HF config.json in, validated frozen dataclass out.

One decoder serves three families, told apart by the HF config's `model_type`:

    family         mixers                          attention    q/k norm   RMSNorm scale
    qwen3_5_text   Gated DeltaNet + full attention output gate  1 + w      1 + w
    qwen3          full attention only             plain        w          w
    llama          full attention only             plain        none       w

For Qwen3.5 both forms transformers writes are accepted: the multimodal checkpoint
(`model_type` "qwen3_5", text fields under `text_config`, `tie_word_embeddings` at the top
level) and the flat text config ("qwen3_5_text"). RoPE settings are read from
`rope_parameters` (transformers 5) or the legacy top-level `rope_theta` /
`partial_rotary_factor` / `rope_scaling` keys.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
_LAYER_TYPES = (LINEAR_ATTENTION, FULL_ATTENTION)
QWEN3_5, QWEN3, LLAMA = "qwen3_5_text", "qwen3", "llama"
FAMILIES = (QWEN3_5, QWEN3, LLAMA)
ARCHITECTURES = {QWEN3_5: "Qwen3_5ForCausalLM", QWEN3: "Qwen3ForCausalLM", LLAMA: "LlamaForCausalLM"}
# transformers' defaults for the fields a Llama / Qwen3 config.json may leave out (LlamaConfig,
# Qwen3Config); where our dataclass default (the Qwen3.5 9B) differs, these win for that family.
_FAMILY_DEFAULTS = {
    LLAMA: dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10_000.0,
                max_position_embeddings=2048, pad_token_id=None, bos_token_id=1, eos_token_id=2),
    QWEN3: dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                num_attention_heads=32, head_dim=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_theta=10_000.0, max_position_embeddings=32768, pad_token_id=None, bos_token_id=None,
                eos_token_id=None),
}


@dataclasses.dataclass(frozen=True)
class Qwen3_5Config:
    """The decoder's config for every family (see the module doc); the defaults are the 9B's."""
    model_type: str = QWEN3_5
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
        if self.model_type != QWEN3_5 and not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_hidden_layers)
        if not self.layer_types:
            object.__setattr__(self, "layer_types", default_layer_types(self.num_hidden_layers))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        self.validate()

    # ---- family options ----------------------------------------------------------------
    @property
    def attention_output_gate(self) -> bool:
        """q_proj holds per head [query | gate] and the output is gated by sigmoid(gate) (Qwen3.5)."""
        return self.model_type == QWEN3_5

    @property
    def qk_norm(self) -> bool:
        """RMSNorms on each head's query and key before RoPE (Qwen3.5, Qwen3; not Llama)."""
        return self.model_type != LLAMA

    @property
    def norm_offset(self) -> bool:
        """RMSNorm scale is 1 + w, w starting at 0 (Qwen3.5); else plain w starting at 1."""
        return self.model_type == QWEN3_5

    @property
    def architecture(self) -> str:
        """The transformers class name an export's config.json names."""
        return ARCHITECTURES[self.model_type]

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

        if self.model_type not in FAMILIES:
            bad("model_type", self.model_type, f"expected one of {FAMILIES}")
        if self.model_type != QWEN3_5 and set(self.layer_types) != {FULL_ATTENTION}:
            bad("layer_types", sorted(set(self.layer_types)),
                f"a {self.model_type} model has only {FULL_ATTENTION!r} layers")

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
        """Builds from a transformers config dict: Qwen3.5 multimodal ("qwen3_5") or text
        ("qwen3_5_text"), "qwen3" or "llama"."""
        model_type = d.get("model_type", QWEN3_5)
        if model_type in (QWEN3, LLAMA):
            return cls._from_dense_dict(model_type, d)
        if model_type == "qwen3_5" or "text_config" in d:
            text = dict(d.get("text_config") or {})
            if "tie_word_embeddings" in d:  # the top-level flag is what transformers ties on
                text["tie_word_embeddings"] = d["tie_word_embeddings"]
        elif model_type == "qwen3_5_text":
            text = dict(d)
        else:
            raise ValueError(f"config model_type={model_type!r}: expected one of 'qwen3_5', "
                             f"{', '.join(repr(f) for f in FAMILIES)}")

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
    def _from_dense_dict(cls, model_type: str, d: dict[str, Any]) -> "Qwen3_5Config":
        """A Llama / Qwen3 config.json: every layer full attention, RoPE over the whole head."""
        def refuse(key, value, why):
            raise ValueError(f"config {key}={value!r}: {why} (a {model_type} checkpoint this package cannot run)")

        if d.get("mlp_bias"):
            refuse("mlp_bias", d["mlp_bias"], "biased MLP projections are not implemented")
        if d.get("pretraining_tp", 1) != 1:
            refuse("pretraining_tp", d["pretraining_tp"], "only pretraining_tp=1 is implemented")
        if d.get("use_sliding_window"):
            refuse("use_sliding_window", d["use_sliding_window"], "sliding-window attention is not implemented")
        kw: dict[str, Any] = dict(_FAMILY_DEFAULTS[model_type])
        names = {f.name for f in dataclasses.fields(cls)} - {"layer_types", "partial_rotary_factor",
                                                               "mrope_section", "mrope_interleaved"}
        for k in names & set(d):  # a null token id is kept; other nulls take the default
            if d[k] is not None or k.endswith("_token_id"):
                kw[k] = d[k]
        kw["model_type"] = model_type
        kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
        if d.get("head_dim") is None:
            kw["head_dim"] = kw["hidden_size"] // kw["num_attention_heads"]
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        kw["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
        kw["rope_theta"] = rope.get("rope_theta", d.get("rope_theta", kw["rope_theta"]))
        kw.update(partial_rotary_factor=1.0, mrope_section=(), mrope_interleaved=False,
                  layer_types=(FULL_ATTENTION,) * int(kw["num_hidden_layers"]))
        return cls(**kw)

    @classmethod
    def from_hf_dir(cls, path: str) -> "Qwen3_5Config":
        file = os.path.join(path, "config.json")
        if not os.path.exists(file):
            raise ValueError(f"no config.json in {path!r}: expected a HF checkpoint directory "
                             f"(Qwen3.5, Qwen3 or Llama)")
        with open(file) as fh:
            return cls.from_hf_dict(json.load(fh))

    def to_hf_text_dict(self) -> dict[str, Any]:
        """The flat transformers 5 text config of the family ("qwen3_5_text", "qwen3", "llama"),
        with `architectures`."""
        if self.model_type != QWEN3_5:
            return self._to_dense_dict()
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
        d["model_type"] = QWEN3_5
        d["architectures"] = [self.architecture]
        return d

    def _to_dense_dict(self) -> dict[str, Any]:
        keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings",
                "max_position_embeddings", "hidden_act", "attention_bias", "attention_dropout",
                "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id")
        d = {k: getattr(self, k) for k in keep}
        if isinstance(self.eos_token_id, tuple):
            d["eos_token_id"] = list(self.eos_token_id)
        d["rope_parameters"] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        d["model_type"] = self.model_type
        d["architectures"] = [self.architecture]
        if self.model_type == LLAMA:
            d.update(mlp_bias=False, pretraining_tp=1)
        else:
            d.update(use_sliding_window=False, layer_types=list(self.layer_types))
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

    @classmethod
    def tiny_dense(cls, model_type: str = LLAMA, **overrides) -> "Qwen3_5Config":
        """A few-second CPU Llama / Qwen3 (GQA, full RoPE, 4 attention layers)."""
        kw = dict(model_type=model_type, vocab_size=320, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  rope_theta=10_000.0, partial_rotary_factor=1.0, mrope_section=(), mrope_interleaved=False,
                  rms_norm_eps=1e-5, max_position_embeddings=4096, pad_token_id=0, bos_token_id=None,
                  eos_token_id=1)
        kw.update(overrides)
        return cls(**kw)


def default_layer_types(num_layers: int, full_attention_interval: int = 4) -> tuple[str, ...]:
    """transformers' default: every `interval`-th layer is full attention, the rest DeltaNet."""
    return tuple(FULL_ATTENTION if (i + 1) % full_attention_interval == 0 else LINEAR_ATTENTION
                 for i in range(num_layers))
