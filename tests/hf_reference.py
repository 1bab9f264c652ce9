"""Tiny transformers Qwen3.5 reference models, built on the CPU on the fly (no downloads).

Every model test compares against these. The variants differ on purpose (GQA ratio,
Hv/Hk, head dims, conv kernel, tied/untied heads, rotary fraction, layer order) so a
layout bug that one config hides shows up in another. Weights are drawn with a larger
std than HF's default and every norm weight (which starts at 0 in HF) is perturbed,
so logits are far from trivial.
"""
from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5TextConfig,
)

VOCAB = 320

TEXT_VARIANTS: dict[str, dict] = {
    # 3 DeltaNet + 1 attention like the 9B; GQA 2, Hv/Hk 2, conv 4, untied.
    "gqa2_conv4_untied": dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        tie_word_embeddings=False, partial_rotary_factor=0.25,
    ),
    # GQA 4, Hv == Hk, conv 2, tied head, half rotary, attention in the middle.
    "gqa4_conv2_tied": dict(
        hidden_size=48, intermediate_size=80, num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=2,
        tie_word_embeddings=True, partial_rotary_factor=0.5,
    ),
    # No GQA sharing ratio 1 on attention, Hv/Hk 3, odd head dims, conv 3, full rotary.
    "mha_conv3_hv3": dict(
        hidden_size=40, intermediate_size=72, num_hidden_layers=5,
        layer_types=["full_attention", "linear_attention", "linear_attention",
                     "full_attention", "linear_attention"],
        num_attention_heads=3, num_key_value_heads=3, head_dim=8,
        linear_num_key_heads=1, linear_num_value_heads=3,
        linear_key_head_dim=12, linear_value_head_dim=10, linear_conv_kernel_dim=3,
        tie_word_embeddings=False, partial_rotary_factor=1.0,
    ),
}


def text_config(variant: str, **overrides) -> Qwen3_5TextConfig:
    kw = dict(TEXT_VARIANTS[variant])
    partial = kw.pop("partial_rotary_factor")
    kw.update(
        vocab_size=VOCAB, rms_norm_eps=1e-6, max_position_embeddings=4096,
        initializer_range=0.08, pad_token_id=0, eos_token_id=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": partial,
                         "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    )
    kw.update(overrides)
    cfg = Qwen3_5TextConfig(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def _tiny_vision_config(out_hidden: int) -> dict:
    return dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2,
                patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
                out_hidden_size=out_hidden, num_position_embeddings=16)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * 0.5)
            elif name.endswith("dt_bias") or name.endswith("A_log"):
                p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * 0.3)


def build_hf_model(variant: str, *, multimodal: bool = False, seed: int = 0,
                   dtype: torch.dtype = torch.float32, **overrides) -> torch.nn.Module:
    """A random tiny transformers model in eval mode, fp32 by default, eager attention."""
    torch.manual_seed(seed)
    tcfg = text_config(variant, **overrides)
    if multimodal:
        cfg = Qwen3_5Config(text_config=tcfg.to_dict(),
                            vision_config=_tiny_vision_config(tcfg.hidden_size),
                            tie_word_embeddings=tcfg.tie_word_embeddings)
        cfg._attn_implementation = "eager"
        cfg.text_config._attn_implementation = "eager"
        model = Qwen3_5ForConditionalGeneration(cfg)
    else:
        model = Qwen3_5ForCausalLM(tcfg)
    _perturb(model, seed + 1)
    return model.to(dtype).eval()


def save_hf_model(model: torch.nn.Module, out_dir: str, *, add_mtp: bool = False,
                  max_shard_size: str | None = None) -> str:
    """save_pretrained into out_dir; optionally add fake `mtp.*` tensors like the real checkpoint.

    The real 9B checkpoint stores `linear_attn.A_log` and `linear_attn.norm.weight` in F32
    while the rest is bf16; a bf16 model saved here reproduces that mix so dtype handling
    is exercised.
    """
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(out_dir, safe_serialization=True, **kw)
    files = sorted(f for f in os.listdir(out_dir) if f.endswith(".safetensors"))
    keep_f32 = (".linear_attn.A_log", ".linear_attn.norm.weight")
    for f in files:
        path = os.path.join(out_dir, f)
        tensors = _load_any(path)
        changed = False
        for k in list(tensors):
            if k.endswith(keep_f32) and tensors[k].dtype != np.float32:
                tensors[k] = tensors[k].astype(np.float32)
                changed = True
        if add_mtp and f == files[-1]:
            rng = np.random.default_rng(7)
            h = model.config.get_text_config().hidden_size
            tensors["mtp.fc.weight"] = rng.standard_normal((h, 2 * h)).astype(np.float32)
            tensors["mtp.norm.weight"] = rng.standard_normal((h,)).astype(np.float32)
            changed = True
            _add_to_index(out_dir, f, ["mtp.fc.weight", "mtp.norm.weight"])
        if changed:
            save_file(tensors, path, metadata={"format": "pt"})
    return out_dir


def _load_any(path: str) -> dict:
    # safetensors.numpy understands bf16 through ml_dtypes only in recent versions; torch always does.
    from safetensors.torch import load_file as load_torch
    out = {}
    for k, t in load_torch(path).items():
        if t.dtype == torch.bfloat16:
            import ml_dtypes
            out[k] = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            out[k] = t.numpy()
    return out


def _add_to_index(out_dir: str, filename: str, names: list[str]) -> None:
    index = os.path.join(out_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        return
    with open(index) as fh:
        data = json.load(fh)
    for n in names:
        data["weight_map"][n] = filename
    with open(index, "w") as fh:
        json.dump(data, fh, indent=2)


def hf_logits(model: torch.nn.Module, input_ids: np.ndarray, *,
              attention_mask: np.ndarray | None = None,
              position_ids: np.ndarray | None = None, as_float64: bool = False) -> np.ndarray:
    """Logits [B, T, V] as float32 numpy from a transformers model (float64 if `as_float64`)."""
    kw = {"input_ids": torch.as_tensor(np.asarray(input_ids), dtype=torch.long)}
    if attention_mask is not None:
        kw["attention_mask"] = torch.as_tensor(np.asarray(attention_mask), dtype=torch.long)
    if position_ids is not None:
        kw["position_ids"] = torch.as_tensor(np.asarray(position_ids), dtype=torch.long)
    with torch.no_grad():
        out = model(**kw)
    return out.logits.double().numpy() if as_float64 else out.logits.float().numpy()


class _KeepFloat64(torch.overrides.TorchFunctionMode):
    """Inside this mode a float64 tensor is never cast down to float32: `.float()`,
    `.to(torch.float32)`, `.type(torch.float32)` and `softmax(..., dtype=torch.float32)` on a
    float64 input keep float64. Everything else runs as written."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        first = args[0] if args else None
        is_f64 = isinstance(first, torch.Tensor) and first.dtype == torch.float64
        if is_f64 and func in (torch.Tensor.float,):
            return first
        if is_f64 and func in (torch.Tensor.to, torch.Tensor.type):
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        if is_f64 and kwargs.get("dtype") is torch.float32:  # softmax(x, dtype=float32), ...
            kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


def _rotary_forward_float64(self, x, position_ids):
    """Qwen3_5TextRotaryEmbedding.forward with the float32 angles (the model's definition:
    float32 positions times the float32 inverse frequencies, as transformers computes them)
    but cos/sin evaluated in x's dtype, so a float64 model gets float64 cos/sin of them."""
    position_ids = position_ids.expand(3, -1, -1)
    # the float32 buffer as the model initialises it (the model's own copy was cast to float64)
    inv_freq, _ = self.compute_default_rope_parameters(self.config, device=x.device)
    freqs = position_ids[..., None].to(torch.float32) * inv_freq
    freqs = freqs.to(x.dtype)
    cos = freqs.cos() * self.attention_scaling
    sin = freqs.sin() * self.attention_scaling
    return self.recomposition_frequencies(cos).to(x.dtype), self.recomposition_frequencies(sin).to(x.dtype)


@contextlib.contextmanager
def float64_everywhere():
    """Makes a float64 transformers model float64 all the way.

    transformers' "float64" Qwen3.5 still computes in float32 in many places: both delta-rule
    kernels cast q/k/v/g/beta to float32, the RMS norms and the gated norm cast to float32,
    the attention softmax runs in float32, q/k are rotated in float32, and A_log is read as
    float32. So transformers fp32 vs its "float64" never measures those parts' rounding.
    Inside this context transformers' own code runs with every such cast kept at float64
    (`_KeepFloat64`), and the rotary cos/sin are evaluated in float64 from the same float32
    angles (`_rotary_forward_float64`). Our model in float64 (JAX_ENABLE_X64) does the same.
    """
    cls = modeling_qwen3_5.Qwen3_5TextRotaryEmbedding
    saved = cls.forward
    cls.forward = _rotary_forward_float64
    try:
        with _KeepFloat64():
            yield
    finally:
        cls.forward = saved

def hf_logits_float64(model: torch.nn.Module, input_ids: np.ndarray, **kw) -> np.ndarray:
    """Logits [B, T, V] as float64 numpy from a float64 model computed in float64 throughout."""
    assert next(model.parameters()).dtype == torch.float64, "needs a float64 model"
    with float64_everywhere():
        return hf_logits(model, input_ids, as_float64=True, **kw)


__all__ = ["TEXT_VARIANTS", "VOCAB", "build_hf_model", "float64_everywhere", "hf_logits",
           "hf_logits_float64", "load_file",
           "save_hf_model", "text_config"]
