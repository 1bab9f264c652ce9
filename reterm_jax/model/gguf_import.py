"""A llama.cpp GGUF file -> an HF checkpoint directory our loader (and transformers) reads.

    write_hf_dir(read_gguf("model.gguf"), "out/", dtype="float32")

Reads the file with the `gguf` package (the llama.cpp project's reader), dequantises every tensor
with its `gguf.quants.dequantize` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_x, the K-quants, ...),
renames llama.cpp's tensors to HF's, and undoes the row permutation llama.cpp's converter applies
to a Llama's q_proj / k_proj (its RoPE pairs dims (2i, 2i+1); HF's rotate-half pairs (i, i+d/2)).
Writes config.json (from the file's `<arch>.*` keys), model.safetensors and the tokenizer
(data/gguf_tokenizer.py). Architectures: llama and qwen3. A file of another architecture, or one
that is not a whole GGUF file, is refused before anything is written.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

import numpy as np

from reterm_jax.errors import UserError

SUPPORTED = ("llama", "qwen3")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight$")


class GGUFError(UserError):
    """A GGUF file this importer cannot convert (one line: what it is and what is supported)."""


def read_gguf(path: str):
    """The file's gguf.GGUFReader, or one GGUFError line when it is missing, not a whole GGUF file,
    or of an architecture other than SUPPORTED."""
    import gguf
    if not os.path.isfile(path):
        raise GGUFError(f"--gguf={path}: no such file")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError / IndexError / OSError on a cut or foreign file
        raise GGUFError(f"--gguf={path}: not a readable GGUF file ({type(e).__name__}: {e}); "
                        f"a truncated download? fetch it again") from None
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED:
        raise GGUFError(f"--gguf={path}: architecture {arch!r} is not supported; the importer reads "
                        f"{', '.join(SUPPORTED)} GGUF files")
    return reader


def field(reader, key: str, default=None):
    """A metadata value as Python (str, number, list), or `default` when the file lacks it."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_config(reader) -> dict:
    """config.json of the HF class transformers' GGUF loader builds for this file."""
    arch = field(reader, "general.architecture")
    key = lambda name, default=None: field(reader, f"{arch}.{name}", default)
    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    vocab = key("vocab_size") or len(field(reader, "tokenizer.ggml.tokens"))
    if key("rope.scaling.type") not in (None, "none"):
        raise GGUFError(f"GGUF {arch}.rope.scaling.type={key('rope.scaling.type')!r}: only plain RoPE is implemented")
    head_dim = int(key("attention.key_length") or key("rope.dimension_count") or hidden // heads)
    names = {t.name for t in reader.tensors}
    cfg = {
        "model_type": arch, "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen3ForCausalLM"],
        "vocab_size": int(vocab), "hidden_size": hidden, "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)), "head_dim": head_dim,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(key("context_length", 2048)),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0))},
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": field(reader, "tokenizer.ggml.padding_token_id"),
    }
    if arch == "llama":
        cfg.update(mlp_bias=False, pretraining_tp=1)
    return cfg


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: within each head, rows (2i, 2i+1) back to (i, i + d/2)."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(reader, config: dict):
    """(HF name, float32 array in HF's [out, in] layout) for every tensor, one at a time."""
    import gguf
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            raise GGUFError("GGUF rope_freqs.weight (Llama 3 RoPE scaling) is not implemented")
        match = _LAYER.match(t.name)
        if match:
            part = _LAYER_NAMES.get(match.group(2))
            name = None if part is None else f"model.layers.{match.group(1)}.{part}.weight"
        else:
            name = _TOP_NAMES.get(t.name)
        if name is None:
            raise GGUFError(f"GGUF tensor {t.name!r} has no place in a {config['model_type']} model")
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims innermost first
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
        if config["model_type"] == "llama" and match and match.group(2) in ("attn_q", "attn_k"):
            heads = config["num_attention_heads" if match.group(2) == "attn_q" else "num_key_value_heads"]
            w = unpermute_rows(w, heads)
        yield name, w


def write_hf_dir(reader, out_dir: str, *, dtype: str = "float32") -> str:
    """config.json, model.safetensors (fp32 or bf16) and the tokenizer files, written to a temporary
    directory beside `out_dir` and moved into place at the end (an interrupted run leaves no half dir)."""
    from safetensors.numpy import save_file

    from reterm_jax.data.gguf_tokenizer import write_tokenizer
    if dtype not in ("float32", "bfloat16"):
        raise GGUFError(f"--dtype={dtype}: a GGUF import writes float32 or bfloat16")
    config = hf_config(reader)
    out_dir = os.path.abspath(out_dir)
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".gguf_import_", dir=os.path.dirname(out_dir))
    try:
        cast = np.float32
        if dtype == "bfloat16":
            import ml_dtypes
            cast = ml_dtypes.bfloat16
        tensors = {name: w.astype(cast) for name, w in hf_tensors(reader, config)}
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        config["dtype"] = dtype
        with open(os.path.join(tmp, "config.json"), "w") as fh:
            json.dump(config, fh, indent=2, sort_keys=True)
            fh.write("\n")
        write_tokenizer(reader, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the model from other users
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
