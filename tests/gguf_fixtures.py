"""A tiny Llama GGUF file written on the fly with the `gguf` package (llama.cpp's own writer).

The weights are a random transformers LlamaForCausalLM's, written the way llama.cpp's converter
writes them: q/k rows permuted for its RoPE layout, every projection in a different ggml type
(F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K), hidden size 256 so the K-quants' 256-wide
blocks fit; the vocabulary is the bundled tiny byte-level BPE tokenizer's (1,060 tokens).
The `gguf` package cannot quantise to K-quants, so those two tensors are random K-quant blocks
(random bytes, their fp16 block scales set to small finite values): valid files whose values
only the dequantisers define, which is what the comparison with transformers' own dequantiser
(integrations/gguf/dequant.py) checks.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from hf_dense_reference import build_hf_dense_model
from reterm_jax.data.assets import TINY_TOKENIZER_DIR

QTYPES = {  # llama.cpp tensor -> the ggml type it is written in
    "token_embd": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "Q4_K", "attn_output": "Q6_K",
    "ffn_gate": "F16", "ffn_up": "Q5_0", "ffn_down": "BF16", "attn_norm": "F32", "ffn_norm": "F32",
    "output_norm": "F32", "output": "Q8_0",
}
_HF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
       "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
       "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF rotate-half -> interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# K-quant block layouts: (bytes per 256-value block, byte offsets of the fp16 scale fields)
_K_BLOCKS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}


def random_k_quant(shape, qtype: str, rng) -> np.ndarray:
    size, scale_at = _K_BLOCKS[qtype]
    rows, cols = shape
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    for at in scale_at:
        scale = rng.uniform(0.001, 0.004, (rows, cols // 256)).astype(np.float16)
        blocks[..., at:at + 2] = scale[..., None].view(np.uint8).reshape(rows, cols // 256, 2)
    return blocks.reshape(rows, -1)


def tiny_vocab():
    with open(f"{TINY_TOKENIZER_DIR}/tokenizer.json") as fh:
        tok = json.load(fh)
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens, types = [t for t, _ in vocab], [1] * len(vocab)
    for added in sorted(tok["added_tokens"], key=lambda a: a["id"]):
        assert added["id"] == len(tokens)
        tokens.append(added["content"])
        types.append(3 if added["special"] else 4)
    return tokens, types, [" ".join(m) for m in tok["model"]["merges"]]


def write_tiny_llama_gguf(path: str, *, tied: bool = False, seed: int = 0, arch: str = "llama"):
    """(the transformers model whose weights were written, path)."""
    import gguf
    tokens, types, merges = tiny_vocab()
    hf = build_hf_dense_model("llama_gqa3_tied", seed=seed, vocab_size=len(tokens), hidden_size=256,
                              intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=64, tie_word_embeddings=tied)
    cfg = hf.config
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    for name, t in hf.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        a = t.detach().to(torch.float32).numpy()
        if name.startswith("model.layers."):
            layer, rest = name[len("model.layers."):].split(".", 1)
            base = _HF[rest.rsplit(".", 1)[0]]
            gname = f"blk.{layer}.{base}.weight"
            if base == "attn_q":
                a = permute_rows(a, cfg.num_attention_heads)
            elif base == "attn_k":
                a = permute_rows(a, cfg.num_key_value_heads)
        else:
            base = {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm",
                    "lm_head.weight": "output"}[name]
            gname = base + ".weight"
        qtype = gguf.GGMLQuantizationType[QTYPES[base]]
        if QTYPES[base] in _K_BLOCKS:
            w.add_tensor(gname, random_k_quant(a.shape, QTYPES[base], rng), raw_dtype=qtype)
        elif qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(gname, a)
        else:
            w.add_tensor(gname, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf, path
