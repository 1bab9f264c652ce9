"""HF checkpoint dir <-> orbax params checkpoint.

    python -m reterm_jax.convert --from=gguf --gguf=FILE.gguf --out=HF_DIR [--dtype=bfloat16]
    python -m reterm_jax.convert --to=orbax --hf=HF_DIR --out=CKPT_DIR [--param_dtype=float32]
    python -m reterm_jax.convert --to=hf --checkpoint=CKPT_DIR --out=HF_DIR \
        [--source=HF_DIR] [--dtype=bfloat16] [--mesh=1,-1,1]

An orbax dir written here holds `params/` (a StandardCheckpointer tree of the model's
nnx.Param values, HF names as keys), `config.json` (the HF config, copied) and
`reterm_convert.json` (where it came from). `--to=hf` also accepts a training run's
CheckpointManager dir (`<step>/params`, latest step), given a config.json via --source.

Export with --source (default: the HF dir recorded at conversion, if it still exists)
copies the vision tower, MTP head, config and tokenizer files and keeps every tensor's
source dtype, so HF -> orbax -> HF is bit-identical.

`--from=gguf` imports a llama.cpp GGUF file (Llama or Qwen3) as an HF dir: dequantised weights
(fp32, or bf16 with --dtype=bfloat16), llama.cpp's q/k row permutation undone, config.json and the
tokenizer files (reterm_jax/model/gguf_import.py).
"""
from __future__ import annotations

import json
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging
from flax import nnx

from reterm_jax import cli
from reterm_jax.errors import UserError
from reterm_jax.train.checkpointing import PARAMS_ITEM, find_params_dir

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags, defined only when this module is the program (`python -m
    reterm_jax.convert`): other CLIs import its functions and may have flags of the same names."""
    flags.DEFINE_enum("to", None, ["orbax", "hf"], "Direction: HF dir -> orbax, or orbax -> HF dir.")
    flags.DEFINE_enum("from", None, ["gguf"], "Import a llama.cpp GGUF file (--gguf) as an HF dir (--out).")
    flags.DEFINE_string("gguf", None, "--from=gguf: the GGUF file to import.")
    flags.DEFINE_string("hf", None, "--to=orbax: HF checkpoint dir to read.")
    flags.DEFINE_string("checkpoint", None, "--to=hf: orbax checkpoint dir to read.")
    flags.DEFINE_string("out", None, "Output directory.")
    flags.DEFINE_string("source", None, "--to=hf: original HF dir (vision/MTP tensors, dtypes, tokenizer).")
    flags.DEFINE_string("dtype", None, "--to=hf: cast exported tensors to this dtype (A_log and "
                        "linear_attn.norm stay float32), e.g. bfloat16. Default: the source's dtypes.")
    flags.DEFINE_string("param_dtype", "float32", "--to=orbax: dtype of the stored params.")
    flags.DEFINE_bool("overwrite", False, "--to=hf: write into a non-empty --out directory (its *.safetensors "
                      "and index are replaced); without it a non-empty --out is refused.")
    flags.DEFINE_string("mesh", None, "Optional 'data,fsdp,tensor' sizes to shard params over, e.g. 1,-1,1.")


INFO_FILE = "reterm_convert.json"


def hf_to_orbax(hf_dir: str, out_dir: str, *, param_dtype=jnp.float32, mesh=None) -> str:
    """Load an HF dir (streamed, sharded over `mesh`) and save its params with orbax."""
    import orbax.checkpoint as ocp
    from reterm_jax.model.hf_io import load_pretrained

    params_dir = os.path.join(os.path.abspath(out_dir), PARAMS_ITEM)
    if os.path.exists(params_dir):
        raise FileExistsError(f"{params_dir} already exists; choose an empty --out directory")
    model = load_pretrained(hf_dir, jnp.float32, mesh, param_dtype=param_dtype)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(params_dir, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
        ckptr.wait_until_finished()
    if jax.process_index() == 0:
        shutil.copyfile(os.path.join(hf_dir, "config.json"), os.path.join(out_dir, "config.json"))
        info = {"source_hf_dir": os.path.abspath(hf_dir), "param_dtype": str(np.dtype(param_dtype)),
                "created_unix": int(time.time())}
        with open(os.path.join(out_dir, INFO_FILE), "w") as fh:
            json.dump(info, fh, indent=2)
    return params_dir


def restore_model(checkpoint: str, *, config_dir: str | None = None, mesh=None, rules=None):
    """Build the abstract model from config.json and restore the orbax params into it.

    Each param is restored with the dtype it was stored in, onto its sharding under
    `mesh` (single default device when None), in the layout it was stored in: per layer, or
    stacked (a run with model.scan_layers; save_pretrained writes either as HF's per-layer names).
    """
    import orbax.checkpoint as ocp
    from reterm_jax.model.config import Qwen3_5Config
    from reterm_jax.model.hf_io import abstract_model, param_sharding

    params_dir = find_params_dir(checkpoint)
    config_dir = config_dir or _config_dir(checkpoint)
    config = Qwen3_5Config.from_hf_dir(config_dir)
    with ocp.StandardCheckpointer() as ckptr:
        stored = _flat(ckptr.metadata(params_dir).item_metadata.tree)
        model = abstract_model(config, jnp.float32, scan_layers=any(k.startswith("model.blocks.") for k in stored))
        graphdef, state = nnx.split(model, nnx.Param)
        target, wanted = {}, set()
        for path, var in nnx.to_flat_state(state):
            key = ".".join(map(str, path))
            if key not in stored:
                raise KeyError(f"{params_dir}: no param {key}; was it written for another config "
                               f"than {config_dir}/config.json?")
            shape, meta = var.get_value().shape, stored[key]
            if tuple(meta.shape) != tuple(shape):
                raise ValueError(f"{params_dir}: {key} has shape {list(meta.shape)}, config expects {list(shape)}")
            target[key] = jax.ShapeDtypeStruct(shape, meta.dtype, sharding=param_sharding(var, mesh, rules))
            wanted.add(key)
        extra = sorted(set(stored) - wanted)
        if extra:
            raise ValueError(f"{params_dir}: params the model does not have: {extra[:8]}")
        restored = _flat(ckptr.restore(params_dir, _nest(target)))
    for path, var in nnx.to_flat_state(state):
        var.set_value(restored[".".join(map(str, path))])
    return nnx.merge(graphdef, state)


def orbax_to_hf(checkpoint: str, out_dir: str, *, source: str | None = None, dtype=None,
                mesh=None, max_shard_size="5GB") -> None:
    from reterm_jax.model.hf_io import save_pretrained

    if source is None:
        recorded = _info(checkpoint).get("source_hf_dir")
        if recorded and os.path.isdir(recorded):
            logging.info("using the recorded source HF dir %s (override with --source)", recorded)
            source = recorded
    model = restore_model(checkpoint, config_dir=None if _has_config(checkpoint) else source, mesh=mesh)
    save_pretrained(model, out_dir, source=source, dtype=dtype, max_shard_size=max_shard_size)


# --------------------------------------------------------------------------- helpers


def _has_config(checkpoint: str) -> bool:
    return os.path.exists(os.path.join(checkpoint, "config.json"))


def _config_dir(checkpoint: str) -> str:
    if _has_config(checkpoint):
        return checkpoint
    raise FileNotFoundError(f"{checkpoint} has no config.json; pass --source=HF_DIR (the HF "
                            "checkpoint the params came from) so the model config is known")


def _info(checkpoint: str) -> dict:
    path = os.path.join(checkpoint, INFO_FILE)
    return json.load(open(path)) if os.path.exists(path) else {}


def _flat(tree, prefix=()) -> dict:
    """Nested dict -> {'model.layers.0.mlp.up_proj.kernel': leaf}; orbax metadata has str
    keys where the nnx pure dict has ints, so dotted strings are the common ground."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flat(v, prefix + (str(k),)))
        return out
    return {".".join(prefix): tree}


def _nest(flat: dict) -> dict:
    out: dict = {}
    for key, v in flat.items():
        *head, leaf = key.split(".")
        node = out
        for k in head:
            node = node.setdefault(k, {})
        node[leaf] = v
    return out


def main(argv):
    try:
        _main(argv)
    except (FileNotFoundError, FileExistsError, KeyError, ValueError) as e:
        # Bad dirs / mismatched configs are user errors: a message, not a traceback.
        raise UserError(e.args[0] if isinstance(e, KeyError) else str(e)) from None


def _main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected positional arguments {argv[1:]}; use --flags only")
    from reterm_jax.parallel.mesh import mesh_from_spec

    def need(*names):
        missing = [n for n in names if not getattr(FLAGS, n)]
        if missing:
            raise UserError(f"--to={FLAGS.to} needs " + ", ".join(f"--{n}" for n in missing))

    def refuse(*names):
        given = [n for n in names if getattr(FLAGS, n)]
        if given:
            raise UserError(f"--to={FLAGS.to} does not take " + ", ".join(f"--{n}" for n in given))

    if FLAGS["from"].value == "gguf":
        _import_gguf()
        return
    if FLAGS.gguf:
        raise UserError("--gguf needs --from=gguf")
    if FLAGS.to is None:
        raise UserError("pass --to=orbax (with --hf, --out), --to=hf (with --checkpoint, --out) or "
                        "--from=gguf (with --gguf, --out)")
    mesh = mesh_from_spec(FLAGS.mesh) if FLAGS.mesh else None
    if FLAGS.to == "orbax":
        need("hf", "out")
        refuse("checkpoint", "source", "dtype")
        if not os.path.isdir(FLAGS.hf):
            raise UserError(f"--hf {FLAGS.hf!r} is not a directory")
        path = hf_to_orbax(FLAGS.hf, FLAGS.out, param_dtype=jnp.dtype(FLAGS.param_dtype), mesh=mesh)
        logging.info("wrote %s", path)
    else:
        need("checkpoint", "out")
        refuse("hf")
        if not os.path.isdir(FLAGS.checkpoint):
            raise UserError(f"--checkpoint {FLAGS.checkpoint!r} is not a directory")
        if FLAGS.source and not os.path.isdir(FLAGS.source):
            raise UserError(f"--source {FLAGS.source!r} is not a directory")
        if os.path.isdir(FLAGS.out) and os.listdir(FLAGS.out) and not FLAGS.overwrite:
            raise UserError(f"--out={FLAGS.out}: is not empty; choose an empty directory or pass --overwrite "
                            "(its safetensors shards and index are replaced)")
        if os.path.exists(FLAGS.out) and not os.path.isdir(FLAGS.out):
            raise UserError(f"--out={FLAGS.out}: is a file; give a directory")
        orbax_to_hf(FLAGS.checkpoint, FLAGS.out, source=FLAGS.source,
                    dtype=jnp.dtype(FLAGS.dtype) if FLAGS.dtype else None, mesh=mesh)
        logging.info("wrote HF checkpoint to %s", FLAGS.out)


def _import_gguf() -> None:
    given = [n for n in ("to", "hf", "checkpoint", "source", "mesh") if getattr(FLAGS, n)]
    if given:
        raise UserError("--from=gguf does not take " + ", ".join(f"--{n}" for n in given))
    if not FLAGS.gguf or not FLAGS.out:
        raise UserError("--from=gguf needs --gguf=FILE and --out=HF_DIR")
    if os.path.isdir(FLAGS.out) and os.listdir(FLAGS.out) and not FLAGS.overwrite:
        raise UserError(f"--out={FLAGS.out}: is not empty; choose an empty directory or pass --overwrite")
    if os.path.exists(FLAGS.out) and not os.path.isdir(FLAGS.out):
        raise UserError(f"--out={FLAGS.out}: is a file; give a directory")
    from reterm_jax.model.gguf_import import read_gguf, write_hf_dir
    reader = read_gguf(FLAGS.gguf)  # one line and nothing written for a foreign or cut file
    path = write_hf_dir(reader, FLAGS.out, dtype=FLAGS.dtype or "float32")
    logging.info("wrote HF checkpoint to %s", path)


if __name__ == "__main__":
    define_flags()
    cli.run(main, config_help=False)
