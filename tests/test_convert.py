"""HF <-> orbax conversion: bit-identical round trips, restored logits, CLI errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from hf_reference import VOCAB, build_hf_model, hf_logits, save_hf_model
from reterm_jax import convert
from reterm_jax.model import safetensors_io as st
from reterm_jax.model.hf_io import load_pretrained

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDS = np.random.default_rng(1).integers(0, VOCAB, size=(2, 9))


def raw_tensors(directory: str) -> dict:
    r = st.CheckpointReader(directory)
    return {n: (r.info(n).dtype, r.info(n).shape, r.raw(n)) for n in r.names()}


def forward(model) -> np.ndarray:
    return np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(IDS)))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    hf = build_hf_model("mha_conv3_hv3", multimodal=True, dtype=torch.bfloat16, seed=11)
    d = str(tmp_path_factory.mktemp("hf"))
    save_hf_model(hf, d, add_mtp=True, max_shard_size="40KB")
    return d


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "reterm_jax.convert", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_hf_orbax_hf_is_bit_identical_and_logits_match(hf_dir, tmp_path):
    from transformers import Qwen3_5ForConditionalGeneration

    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "hf_out")
    convert.hf_to_orbax(hf_dir, ckpt)  # f32 params from a bf16 checkpoint
    info = json.load(open(os.path.join(ckpt, convert.INFO_FILE)))
    assert info["source_hf_dir"] == os.path.abspath(hf_dir) and info["param_dtype"] == "float32"
    restored = convert.restore_model(ckpt)
    assert restored.model.embed_tokens.embedding.get_value().dtype == jnp.float32
    np.testing.assert_array_equal(forward(restored), forward(load_pretrained(hf_dir)))

    convert.orbax_to_hf(ckpt, out, source=hf_dir, max_shard_size="40KB")
    assert raw_tensors(out) == raw_tensors(hf_dir)
    load = lambda d: Qwen3_5ForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    np.testing.assert_array_equal(hf_logits(load(out), IDS), hf_logits(load(hf_dir), IDS))


def test_restore_keeps_the_stored_dtype(hf_dir, tmp_path):
    ckpt = str(tmp_path / "ckpt_bf16")
    convert.hf_to_orbax(hf_dir, ckpt, param_dtype=jnp.bfloat16)
    model = convert.restore_model(ckpt)
    layer = model.model.layers[1]
    assert layer.mlp.up_proj.kernel.get_value().dtype == jnp.bfloat16
    assert layer.linear_attn.A_log.get_value().dtype == jnp.float32
    out = str(tmp_path / "hf_out")
    convert.orbax_to_hf(ckpt, out)  # source taken from the recorded HF dir
    assert raw_tensors(out) == raw_tensors(hf_dir)
    with pytest.raises(FileExistsError, match="already exists"):
        convert.hf_to_orbax(hf_dir, ckpt)


def test_cli_round_trip(hf_dir, tmp_path):
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    proc = run_cli("--to=orbax", f"--hf={hf_dir}", f"--out={ckpt}", "--mesh=1,-1,1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli("--to=hf", f"--checkpoint={ckpt}", f"--out={out}", f"--source={hf_dir}",
                   "--dtype=bfloat16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert raw_tensors(out) == raw_tensors(hf_dir)  # the source is bf16 (+F32 A_log/norm) already
    assert os.path.exists(os.path.join(out, "config.json"))


@pytest.mark.parametrize("args,message", [
    (["--hf=/x", "--out=/y"], "pass --to=orbax"),
    (["--to=orbax", "--out=/y"], "--to=orbax needs --hf"),
    (["--to=orbax", "--hf={hf}", "--out=/y", "--checkpoint=/z"], "does not take --checkpoint"),
    (["--to=hf", "--checkpoint=/does/not/exist", "--out=/y"], "is not a directory"),
    (["--to=hf", "--checkpoint={hf}", "--out=/y"], "no orbax params found"),
])
def test_cli_errors_name_the_problem(hf_dir, args, message):
    proc = run_cli(*(a.format(hf=hf_dir) for a in args))
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-2000:]


def test_stacked_checkpoints_convert_and_warm_start_either_layout(tmp_path):
    """A scan_layers run stores its params stacked by block (model/stacked.py). convert restores
    such a checkpoint as it is and exports HF's per-layer tensors bit for bit; a GRPO warm start
    written in one layout loads into a config of the other (converted on load)."""
    import jax
    import orbax.checkpoint as ocp
    import importlib.util
    from reterm_jax.model.stacked import is_stacked, stack_params
    from reterm_jax.parallel.mesh import make_mesh
    from reterm_jax.rl.grpo.init import load_warm_start
    from reterm_jax.train.state import abstract_params

    hf = build_hf_model("gqa2_conv4_untied", dtype=torch.bfloat16, seed=13, num_hidden_layers=4,
                        layer_types=["linear_attention", "full_attention"] * 2)
    src = str(tmp_path / "hf")
    save_hf_model(hf, src)
    per_layer = nnx.to_pure_dict(nnx.state(load_pretrained(src), nnx.Param))
    stacked = nnx.to_pure_dict(nnx.state(load_pretrained(src, scan_layers=True), nnx.Param))
    ckpts = {}
    for name, params in (("per_layer", per_layer), ("stacked", stacked)):
        ckpts[name] = str(tmp_path / name)
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(os.path.join(ckpts[name], "params"), params)
            ckptr.wait_until_finished()
    restored = convert.restore_model(ckpts["stacked"], config_dir=src)
    assert restored.model.scan_layers
    out = str(tmp_path / "hf_out")
    convert.orbax_to_hf(ckpts["stacked"], out, source=src)
    assert raw_tensors(out) == raw_tensors(src)

    spec = importlib.util.spec_from_file_location("grpo_cfg", os.path.join(REPO, "configs", "grpo.py"))
    grpo_cfg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grpo_cfg)
    mesh = make_mesh()
    for scan, stored, want in ((True, "per_layer", stacked), (False, "stacked", per_layer)):
        config = grpo_cfg.get_config("tiny")
        config.model.hf_path, config.model.scan_layers = src, scan
        _, _, abs_params, shardings = abstract_params(config.model, mesh)
        assert is_stacked(abs_params) == scan
        got = load_warm_start(ckpts[stored], config, mesh, abs_params, shardings)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert is_stacked(stack_params(per_layer, 2))


@pytest.mark.parametrize("variant", ["llama_gqa3_tied", "qwen3_gqa2_untied"])
def test_dense_family_round_trips_through_orbax(variant, tmp_path):
    """A Llama / Qwen3 HF dir -> orbax -> HF dir (with and without --source): bit-identical tensors,
    and transformers loads the sourceless export (our config.json) as the same class."""
    from transformers import AutoModelForCausalLM

    from hf_dense_reference import build_hf_dense_model
    hf = build_hf_dense_model(variant, dtype=torch.bfloat16, seed=3)
    src, ckpt = str(tmp_path / "src"), str(tmp_path / "ckpt")
    hf.save_pretrained(src)
    convert.hf_to_orbax(src, ckpt)
    convert.orbax_to_hf(ckpt, str(tmp_path / "with_source"), source=src)
    assert raw_tensors(str(tmp_path / "with_source")) == raw_tensors(src)
    convert.orbax_to_hf(ckpt, str(tmp_path / "alone"), dtype=jnp.bfloat16)
    ours = raw_tensors(str(tmp_path / "alone"))
    assert {n: v[2] for n, v in ours.items()} == {n: v[2] for n, v in raw_tensors(src).items()}
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "alone"), dtype=torch.float32).eval()
    assert type(back).__name__ == type(hf).__name__
