"""GGUF import against transformers' own GGUF loader (its dequantiser, its q/k un-permutation, its
tokenizer builder), on a tiny Llama file written on the fly (gguf_fixtures.py) in nine ggml types."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from gguf_fixtures import QTYPES, write_tiny_llama_gguf
from reterm_jax.model.gguf_import import read_gguf, unpermute_rows, write_hf_dir
from reterm_jax.model.hf_io import load_pretrained

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_BUILT: dict = {}


def _tiny_files(tmp_path_factory, tied: bool) -> dict:
    """The tiny file, our import of it and transformers' load of it (built once per head kind)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if tied not in _BUILT:
        d = tmp_path_factory.mktemp("gguf")
        original, path = write_tiny_llama_gguf(str(d / "tiny.gguf"), tied=tied)
        ours_dir = write_hf_dir(read_gguf(path), str(d / "hf"))
        ref = AutoModelForCausalLM.from_pretrained(str(d), gguf_file="tiny.gguf", dtype=torch.float32).eval()
        ref_tok = AutoTokenizer.from_pretrained(str(d), gguf_file="tiny.gguf")
        _BUILT[tied] = dict(original=original, path=path, ours=ours_dir, ref=ref, ref_tok=ref_tok, tied=tied)
    return _BUILT[tied]


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def tiny(request, tmp_path_factory):
    return _tiny_files(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return _tiny_files(tmp_path_factory, False)


def test_weights_equal_transformers_dequantised(tiny):
    ours = load_file(os.path.join(tiny["ours"], "model.safetensors"))
    ref = {k: v for k, v in tiny["ref"].state_dict().items() if not (tiny["tied"] and k == "lm_head.weight")}
    assert sorted(ours) == sorted(ref)
    for name, value in ours.items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, ref[name].numpy(), err_msg=name)
    cfg = json.load(open(os.path.join(tiny["ours"], "config.json")))
    assert cfg["tie_word_embeddings"] is tiny["tied"] and cfg["model_type"] == "llama"
    assert set(QTYPES.values()) >= {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}


def test_q_k_rows_come_back_in_hf_order(tiny):
    """Against the weights before quantisation: the un-permuted q/k are the original up to 4-bit
    rounding; left permuted (or permuted with the wrong head count) they are not."""
    ours = load_file(os.path.join(tiny["ours"], "model.safetensors"))
    original = tiny["original"].state_dict()
    heads = {"q_proj": 4, "k_proj": 2}
    for proj, n in heads.items():
        name = f"model.layers.1.self_attn.{proj}.weight"
        want = original[name].numpy()
        rel = lambda got: np.abs(got - want).max() / np.abs(want).max()
        assert rel(ours[name]) < 0.15
        permuted_back = unpermute_rows(unpermute_rows(ours[name], n), n)  # a second pass re-permutes
        assert rel(permuted_back) > 0.5


def test_logits_equal_transformers_gguf_model(tiny):
    ours = load_pretrained(tiny["ours"])
    ids = np.random.default_rng(0).integers(2, 1000, (2, 90))
    with torch.no_grad():
        ref = tiny["ref"](torch.as_tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids))), ref, rtol=0, atol=1e-4)


def test_tokenizer_equals_transformers_gguf_tokenizer(tiny):
    from transformers import AutoTokenizer
    ours = AutoTokenizer.from_pretrained(tiny["ours"])
    texts = ["hello world 12345 8080", "<|im_start|>user\n<tool_call>x</tool_call><|im_end|>\n",
             "ünïcödé — 日本語 🙂  \n\n\t x", "def f(x):\n    return x ** 2  # 3.14", '{"a": [1, null]}']
    for text in texts:
        assert ours.encode(text, add_special_tokens=False) == tiny["ref_tok"].encode(text, add_special_tokens=False)
    assert ours.eos_token == "<|im_end|>" and ours.pad_token == "<|endoftext|>"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert ours.apply_chat_template(messages, tokenize=False) == \
        tiny["ref_tok"].apply_chat_template(messages, tokenize=False)


def test_bfloat16_output(untied, tmp_path):
    tiny = untied
    write_hf_dir(read_gguf(tiny["path"]), str(tmp_path / "bf16"), dtype="bfloat16")
    with open(tmp_path / "bf16" / "model.safetensors", "rb") as fh:
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    assert json.load(open(tmp_path / "bf16" / "config.json"))["dtype"] == "bfloat16"


def _convert(*args, cwd):
    return subprocess.run([sys.executable, "-m", "reterm_jax.convert", *args], cwd=cwd, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)


def test_cli_imports_and_refuses_foreign_or_cut_files(untied, tmp_path):
    tiny = untied
    done = _convert("--from=gguf", f"--gguf={tiny['path']}", f"--out={tmp_path / 'ok'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path / "ok")) == ["config.json", "model.safetensors", "tokenizer.json",
                                                   "tokenizer_config.json"]
    # another architecture: a GGUF file that says gpt2
    _, other = write_tiny_llama_gguf(str(tmp_path / "gpt2.gguf"), arch="gpt2")
    # a cut download: the first half of a good file
    data = open(tiny["path"], "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) // 2])
    for path, says in ((other, "architecture 'gpt2' is not supported; the importer reads llama, qwen3"),
                       (str(cut), "not a readable GGUF file")):
        done = _convert("--from=gguf", f"--gguf={path}", f"--out={tmp_path / 'no'}", cwd=tmp_path)
        assert done.returncode != 0
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and says in lines[0] and path in lines[0], done.stderr
        assert not os.path.exists(tmp_path / "no")
        assert not [f for f in os.listdir(tmp_path) if f.startswith(".gguf_import_")]
    done = _convert("--from=gguf", f"--out={tmp_path / 'no'}", cwd=tmp_path)
    assert done.returncode != 0 and "--from=gguf needs --gguf=FILE and --out=HF_DIR" in done.stderr
