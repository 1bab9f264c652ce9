"""HF safetensors <-> NNX model: bit-exact round trips, logits parity, errors, sharded load."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from hf_reference import VOCAB, build_hf_model, hf_logits, save_hf_model
from reterm_jax.model import safetensors_io as st
from reterm_jax.model.hf_io import abstract_model, hf_name, load_pretrained, save_pretrained
from reterm_jax.model.config import Qwen3_5Config
from xla_env import with_test_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDS = np.random.default_rng(0).integers(0, VOCAB, size=(2, 11))


def raw_tensors(directory: str) -> dict[str, tuple[str, tuple, bytes]]:
    r = st.CheckpointReader(directory)
    return {n: (r.info(n).dtype, r.info(n).shape, r.raw(n)) for n in r.names()}


# Our fp32 logits against transformers' fp32 ones: the floor of tests/test_model_parity.py's fp32
# bound (docs/performance.md, "Parity rounding"). A fixed 1e-4 was missed by 1.1e-4 on one logit of
# an 8-layer model on an AMD EPYC; a wrong weight would be off by far more.
PARITY_ATOL = 3e-4


def our_logits(model, ids=IDS) -> np.ndarray:
    return np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(ids)), np.float32)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bf16_mm(tmp_path_factory):
    """Multimodal bf16 checkpoint (F32 A_log / linear norm like the 9B) + mtp, sharded."""
    hf = build_hf_model("gqa2_conv4_untied", multimodal=True, dtype=torch.bfloat16, seed=3)
    d = str(tmp_path_factory.mktemp("bf16_mm"))
    save_hf_model(hf, d, add_mtp=True, max_shard_size="60KB")
    for f, text in (("tokenizer_config.json", '{"model_max_length": 8}'), ("chat_template.jinja", "{{ x }}")):
        with open(os.path.join(d, f), "w") as fh:
            fh.write(text)
    return hf, d


@pytest.fixture(scope="module")
def f32_tied(tmp_path_factory):
    hf = build_hf_model("gqa4_conv2_tied", seed=5)
    d = str(tmp_path_factory.mktemp("f32_tied"))
    save_hf_model(hf, d)
    return hf, d


# --------------------------------------------------------------------------- raw format


def test_writer_is_read_by_safetensors_and_reader_slices(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((5, 3)).astype(ml_dtypes.bfloat16),
               "b": rng.standard_normal((7,)).astype(np.float32),
               "c": rng.standard_normal((4, 2, 3)).astype(np.float16)}
    pending = [st.PendingTensor(k, st.code_from_dtype(v.dtype), v.shape, lambda v=v: v)
               for k, v in tensors.items()]
    files = st.write_checkpoint(str(tmp_path), pending, max_shard_size=40)
    assert len(files) == 3 and os.path.exists(tmp_path / st.INDEX_FILE)
    index = json.loads((tmp_path / st.INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in tensors.values())
    for k, v in tensors.items():
        with safe_open(str(tmp_path / index["weight_map"][k]), "numpy") as fh:
            got = fh.get_tensor(k)
        assert got.dtype == v.dtype and got.tobytes() == v.tobytes()
    reader = st.CheckpointReader(str(tmp_path))
    np.testing.assert_array_equal(reader.read("c", slice(1, 3)), tensors["c"][1:3])
    np.testing.assert_array_equal(reader.read("a", slice(0, 5, 2)), tensors["a"][::2])
    assert st.parse_size("5GB") == 5 * 10**9 and st.parse_size("2MiB") == 2 << 20
    with pytest.raises(ValueError, match="not a size"):
        st.parse_size("five gigs")


# --------------------------------------------------------------------------- 9B layout


def test_name_table_covers_9b_layout_without_allocating():
    from transformers import Qwen3_5ForConditionalGeneration, Qwen3_5Config as HFConfig

    cfg = Qwen3_5Config.qwen3_5_9b()
    with torch.device("meta"):
        hf = Qwen3_5ForConditionalGeneration(HFConfig(text_config=cfg.to_hf_text_dict(),
                                                      tie_word_embeddings=False))
    expected = {n: tuple(p.shape) for n, p in hf.state_dict().items() if not n.startswith("model.visual.")}
    model = abstract_model(cfg, jnp.bfloat16)
    ours = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, perm = hf_name(path, "model.language_model.")
        shape = var.get_value().shape
        ours[name] = shape if perm is None else tuple(shape[p] for p in np.argsort(perm))
    assert set(ours) == set(expected), (set(ours) ^ set(expected))
    assert ours == expected
    assert len(expected) == 1 + 1 + 1 + 24 * 14 + 8 * 11  # embed, norm, lm_head, layers


# --------------------------------------------------------------------------- round trips


def test_bf16_multimodal_roundtrip_is_bit_identical_and_transformers_loads_it(bf16_mm, tmp_path):
    from transformers import Qwen3_5ForConditionalGeneration

    hf, src = bf16_mm
    model = load_pretrained(src, jnp.float32)  # f32 params from bf16 weights
    out = str(tmp_path / "export")
    save_pretrained(model, out, source=src, max_shard_size="60KB")
    before, after = raw_tensors(src), raw_tensors(out)
    assert set(after) == set(before)
    for n in before:
        assert after[n] == before[n], f"{n} differs after the round trip"
    assert any(n.startswith("mtp.") for n in after) and any(n.startswith("model.visual.") for n in after)
    assert after["model.language_model.layers.0.linear_attn.A_log"][0] == "F32"
    assert after["model.language_model.embed_tokens.weight"][0] == "BF16"
    assert len([f for f in os.listdir(out) if f.endswith(".safetensors")]) > 1
    for f in ("config.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert open(os.path.join(out, f)).read() == open(os.path.join(src, f)).read()
    # Compare loaded-from-disk to loaded-from-disk: transformers keeps the F32 tensors in
    # F32 on load, unlike the in-memory model that was cast to bf16 wholesale.
    load = lambda d: Qwen3_5ForConditionalGeneration.from_pretrained(d, dtype=torch.bfloat16).eval()
    np.testing.assert_array_equal(hf_logits(load(out), IDS), hf_logits(load(src), IDS))


def test_bf16_multimodal_logits_match_transformers(bf16_mm):
    hf, src = bf16_mm
    model = load_pretrained(src, jnp.float32)
    # Same bf16 weights upcast to f32 on both sides, so fp32 parity applies (PARITY_ATOL).
    ref = hf_logits(copy.deepcopy(hf).float(), IDS)
    np.testing.assert_allclose(our_logits(model), ref, atol=PARITY_ATOL, rtol=1e-4)


def test_f32_tied_roundtrip_and_logits(f32_tied, tmp_path):
    from transformers import Qwen3_5ForCausalLM

    hf, src = f32_tied
    model = load_pretrained(src, jnp.float32)
    np.testing.assert_allclose(our_logits(model), hf_logits(hf, IDS), atol=PARITY_ATOL, rtol=1e-4)
    out = str(tmp_path / "export")
    save_pretrained(model, out, source=src)
    assert raw_tensors(out) == raw_tensors(src)
    assert "lm_head.weight" not in raw_tensors(out)
    load = lambda d: Qwen3_5ForCausalLM.from_pretrained(d).eval()
    np.testing.assert_array_equal(hf_logits(load(out), IDS), hf_logits(load(src), IDS))


def test_export_without_source_generates_a_loadable_text_checkpoint(bf16_mm, tmp_path):
    from transformers import Qwen3_5ForCausalLM

    hf, src = bf16_mm
    model = load_pretrained(src, jnp.bfloat16)
    out = str(tmp_path / "plain")
    save_pretrained(model, out)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
    tensors = raw_tensors(out)
    assert all(n.startswith("model.") or n == "lm_head.weight" for n in tensors)
    assert not any(n.startswith(("mtp.", "model.visual.")) for n in tensors)
    # bf16 params export as bf16 with the source's exact bytes; A_log stays F32.
    src_raw = raw_tensors(src)
    for n, v in tensors.items():
        assert v == src_raw[n.replace("model.", "model.language_model.", 1) if n != "lm_head.weight" else n]
    from transformers import Qwen3_5ForConditionalGeneration
    got = hf_logits(Qwen3_5ForCausalLM.from_pretrained(out, dtype=torch.bfloat16).eval(), IDS)
    want = hf_logits(Qwen3_5ForConditionalGeneration.from_pretrained(src, dtype=torch.bfloat16).eval(), IDS)
    np.testing.assert_array_equal(got, want)


def test_dtype_override_keeps_f32_tensors(f32_tied, tmp_path):
    _, src = f32_tied
    model = load_pretrained(src, jnp.float32)
    out = str(tmp_path / "bf16")
    save_pretrained(model, out, source=src, dtype=jnp.bfloat16)
    r, s = st.CheckpointReader(out), st.CheckpointReader(src)
    for n in r.names():
        assert r.info(n).dtype == ("F32" if n.endswith(("A_log", "linear_attn.norm.weight")) else "BF16")
    w = "model.layers.0.mlp.up_proj.weight"
    np.testing.assert_array_equal(r.read(w), s.read(w).astype(ml_dtypes.bfloat16))


# --------------------------------------------------------------------------- errors


def _copy(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def _rewrite(path: str, edit) -> None:
    r = st.CheckpointReader(os.path.dirname(path))
    tensors = {n: r.read(n) for n in r.names() if r.info(n).file == os.path.abspath(path)}
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_missing_unexpected_and_misshaped_tensors_are_named(f32_tied, tmp_path):
    _, src = f32_tied
    name = "model.layers.1.self_attn.k_norm.weight"

    d = _copy(src, tmp_path / "missing")
    _rewrite(os.path.join(d, "model.safetensors"), lambda t: t.pop(name))
    with pytest.raises(KeyError, match=name.replace(".", r"\.")):
        load_pretrained(d)

    d = _copy(src, tmp_path / "extra")
    _rewrite(os.path.join(d, "model.safetensors"),
             lambda t: t.update({"model.layers.0.mlp.bias": np.zeros(3, np.float32)}))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.bias \(model\.safetensors\)"):
        load_pretrained(d)

    d = _copy(src, tmp_path / "shape")
    _rewrite(os.path.join(d, "model.safetensors"), lambda t: t.update({name: np.zeros(5, np.float32)}))
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor .*k_norm\.weight has shape \[5\]"):
        load_pretrained(d)

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(str(tmp_path / "nowhere"))
    os.makedirs(tmp_path / "empty")
    shutil.copy(os.path.join(src, "config.json"), tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_pretrained(str(tmp_path / "empty"))


# --------------------------------------------------------------------------- sharded load

_SHARDED_SCRIPT = textwrap.dedent("""
    import os, sys, json
    import numpy as np, jax, jax.numpy as jnp
    from flax import nnx
    from reterm_jax.model import safetensors_io as st
    from reterm_jax.model.hf_io import load_pretrained, save_pretrained
    from reterm_jax.parallel.mesh import make_mesh
    from reterm_jax.parallel.rules import logical_to_spec, variable_axes
    ckpt, ids = sys.argv[1], np.asarray(json.loads(sys.argv[2]))
    assert jax.device_count() == 8, jax.devices()
    mesh = make_mesh(data=1, fsdp=4, tensor=2)
    model = load_pretrained(ckpt, jnp.float32, mesh)
    specs = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        arr, key = var.get_value(), ".".join(map(str, path))
        assert arr.sharding.mesh == mesh, key
        want = logical_to_spec(variable_axes(var), mesh, shape=arr.shape)
        assert arr.sharding.spec == want, (key, arr.sharding.spec, want)
        specs[key] = [None if s is None else str(s) for s in want]
    gate = model.model.layers[0].mlp.gate_proj.kernel.get_value()
    assert {s.data.shape for s in gate.addressable_shards} == {(gate.shape[0] // 4, gate.shape[1] // 2)}
    assert logical_to_spec(("vocab", "embed"), mesh, shape=(3, 64)) == jax.sharding.PartitionSpec(None, "fsdp")
    forward = nnx.jit(lambda m, x: m(x))
    logits = np.asarray(forward(model, jnp.asarray(ids)))
    single = np.asarray(forward(load_pretrained(ckpt, jnp.float32), jnp.asarray(ids)))
    # Sharded matmuls reduce in a different order; the tiny models are sharp (init std 0.08, perturbed
    # norms), so fp32 reordering noise reaches ~2e-5 in the logits. 1e-4 is the HF-parity tolerance.
    np.testing.assert_allclose(logits, single, atol=1e-4, rtol=1e-4)
    # Export gathers each sharded param back to host: still bit-identical to the source.
    out = sys.argv[3]
    save_pretrained(model, out, source=ckpt, max_shard_size="60KB")
    a, b = st.CheckpointReader(ckpt), st.CheckpointReader(out)
    assert sorted(a.names()) == sorted(b.names())
    assert all(a.raw(n) == b.raw(n) and a.info(n).dtype == b.info(n).dtype for n in a.names())
    print("SPECS=" + json.dumps(specs))
""")


def test_sharded_load_onto_8_device_mesh(bf16_mm, tmp_path):
    _, src = bf16_mm
    env = dict(os.environ, XLA_FLAGS=with_test_flags("--xla_force_host_platform_device_count=8"),
               JAX_PLATFORMS="cpu", JAX_DEFAULT_MATMUL_PRECISION="highest",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT, src, json.dumps(IDS.tolist()),
                           str(tmp_path / "export")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    specs = json.loads(proc.stdout.split("SPECS=")[1])
    # hidden 64 splits over fsdp=4, mlp 96 over tensor=2: both axes really used.
    assert specs["model.layers.0.mlp.gate_proj.kernel"] == ["fsdp", "tensor"]
    assert specs["model.layers.0.mlp.down_proj.kernel"] == ["tensor", "fsdp"]
    assert specs["model.embed_tokens.embedding"] == ["tensor", "fsdp"]
    # in_proj_a has 4 outputs (one per v head): divisible by tensor=2.
    assert specs["model.layers.0.linear_attn.in_proj_a.kernel"][0] == "fsdp"


def test_rules_replicate_dims_that_do_not_divide():
    from reterm_jax.parallel.mesh import make_mesh, resolve_mesh_shape
    from reterm_jax.parallel.rules import logical_to_spec

    mesh = make_mesh(data=1, fsdp=1, tensor=1)
    assert logical_to_spec(("embed", "mlp"), mesh, shape=(64, 96)) == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert resolve_mesh_shape((1, -1, 2), 8) == (1, 4, 2)
    with pytest.raises(ValueError, match="not divisible"):
        resolve_mesh_shape((1, -1, 3), 8)
    with pytest.raises(KeyError, match="no entry in the sharding rules"):
        logical_to_spec(("embedd",), mesh, shape=(4,))

    class FakeMesh:  # only .shape is consulted when picking axes
        shape = {"data": 1, "fsdp": 4, "tensor": 3}
    spec = logical_to_spec(("vocab", "embed"), FakeMesh(), shape=(320, 64))
    assert spec == jax.sharding.PartitionSpec(None, "fsdp")  # 320 % 3 != 0 -> replicated
    spec = logical_to_spec(("batch", "length"), FakeMesh(), shape=(6, 5))
    assert spec == jax.sharding.PartitionSpec("data", None)  # 6 % (1*4) != 0 -> drop fsdp


# --------------------------------------------------------------------------- stacked layout


_STACKED_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, jax, jax.numpy as jnp
    from flax import nnx
    from reterm_jax.model import safetensors_io as st
    from reterm_jax.model.hf_io import load_pretrained, save_pretrained
    from reterm_jax.parallel.mesh import make_mesh
    ckpt, ids, out = sys.argv[1], jnp.asarray(json.loads(sys.argv[2])), sys.argv[3]
    mesh = make_mesh(data=1, fsdp=4, tensor=2)
    model = load_pretrained(ckpt, jnp.float32, mesh, scan_layers=True)
    kernel = model.model.blocks[0].mlp.gate_proj.kernel.get_value()
    assert tuple(kernel.sharding.spec) == (None, "fsdp", "tensor"), kernel.sharding.spec
    assert {s.data.shape for s in kernel.addressable_shards} == {(2, kernel.shape[1] // 4, kernel.shape[2] // 2)}
    forward = nnx.jit(lambda m, x: m(x))
    single = load_pretrained(ckpt, jnp.float32)
    np.testing.assert_allclose(np.asarray(forward(model, ids)), np.asarray(forward(single, ids)), atol=1e-4, rtol=1e-4)
    save_pretrained(model, out, source=ckpt)
    a, b = st.CheckpointReader(ckpt), st.CheckpointReader(out)
    assert sorted(a.names()) == sorted(b.names())
    assert all(a.raw(n) == b.raw(n) for n in a.names())
    print("OK")
""")


def test_stacked_layout_loads_and_exports_hf_names(tmp_path):
    """scan_layers=True stores the layers stacked by block (model/stacked.py): each entry of a
    stacked param is read from (and written to) its layer's HF tensor. Loaded stacked = loaded per
    layer then stacked, bit for bit; the scanned forward matches transformers; the export is
    bit-identical to the source; on an 8-device mesh the stacked axis is replicated and every
    other dim sharded as per layer."""
    from reterm_jax.model.stacked import stack_params
    hf = build_hf_model("gqa2_conv4_untied", dtype=torch.bfloat16, seed=7, num_hidden_layers=8,
                        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2)
    src = str(tmp_path / "src")
    save_hf_model(hf, src)
    stacked = load_pretrained(src, jnp.float32, scan_layers=True)
    per_layer = load_pretrained(src, jnp.float32)
    assert stacked.model.scan_layers and stacked.model.layers is None
    got = nnx.to_pure_dict(nnx.state(stacked, nnx.Param))
    want = stack_params(nnx.to_pure_dict(nnx.state(per_layer, nnx.Param)), 4)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert got["model"]["blocks"][3]["self_attn"]["q_proj"]["kernel"].shape[0] == 2
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the scan runs the loop's ops: equal to the per-layer model (whose parity with transformers
    # the tests above check) up to XLA's fusion; against transformers' fp32 itself, PARITY_ATOL
    logits = our_logits(stacked)
    np.testing.assert_allclose(logits, our_logits(per_layer), atol=2e-5, rtol=0)
    np.testing.assert_allclose(logits, hf_logits(copy.deepcopy(hf).float(), IDS), atol=PARITY_ATOL, rtol=0)
    out = str(tmp_path / "export")
    save_pretrained(stacked, out, source=src)
    assert raw_tensors(out) == raw_tensors(src)
    env = dict(os.environ, XLA_FLAGS=with_test_flags("--xla_force_host_platform_device_count=8"),
               JAX_PLATFORMS="cpu", JAX_DEFAULT_MATMUL_PRECISION="highest",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _STACKED_SCRIPT, src, json.dumps(IDS.tolist()),
                           str(tmp_path / "sharded_export")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-4000:]
