"""GRPO's starting params: an SFT warm start (init.checkpoint: an HF dir or an orbax checkpoint,
else the automatic short SFT of the tiny SFT preset, reterm_jax.presets.sft), model.hf_path, or a
random init (init.from_scratch)."""
from __future__ import annotations

import glob
import os

import jax
from absl import logging
from flax import nnx

from reterm_jax.model.stacked import is_stacked, relayout_params
from reterm_jax.presets import sft as sft_presets
from reterm_jax.train.state import abstract_params, init_params, parse_dtype

def warm_start_sft(config, workdir: str) -> str:
    """The short SFT of the model's SFT preset (tiny or smollm2; same model section) in <workdir>/sft; reused when it
    already finished there, resumed when it stopped half-way. Returns its checkpoints dir."""
    from reterm_jax.train import sft
    sft_config = sft_presets.get_config(config.model.preset)  # the SFT preset of the same model (tiny, smollm2)
    sft_config.model = config.model.copy_and_resolve_references()
    sft_config.seed = config.seed
    sft_config.mesh = config.mesh.copy_and_resolve_references()
    if config.init.sft_steps:
        sft_config.train.steps = config.init.sft_steps
    if config.init.sft_data:
        sft_config.data.path = config.init.sft_data
    if config.init.sft_seq_len:
        sft_config.data.seq_len = config.init.sft_seq_len
    sft_dir = os.path.join(workdir, "sft")
    ckpt_dir = os.path.join(sft_dir, "checkpoints")
    done = os.path.isdir(ckpt_dir) and str(sft_config.train.steps) in os.listdir(ckpt_dir)
    if done:
        logging.info("warm start: reusing the SFT run in %s", sft_dir)
    else:
        logging.info("warm start: no init.checkpoint; running the short SFT (%d steps) into %s",
                     sft_config.train.steps, sft_dir)
        sft.train(sft_config, sft_dir)
    return ckpt_dir


def _is_hf_dir(path: str) -> bool:
    return os.path.exists(os.path.join(path, "config.json")) and bool(glob.glob(os.path.join(path, "*.safetensors")))


def load_warm_start(path: str, config, mesh, abs_params, param_shardings):
    """Params from an HF dir or an orbax checkpoint (a training run's checkpoints dir, one step
    dir, or a `convert --to=orbax` dir), placed on their shardings."""
    if _is_hf_dir(path):
        from reterm_jax.model.hf_io import load_pretrained
        model = load_pretrained(path, parse_dtype(config.model.dtype, "model.dtype"), mesh,
                                param_dtype=parse_dtype(config.model.param_dtype, "model.param_dtype"),
                                scan_layers=is_stacked(abs_params))
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    else:
        import orbax.checkpoint as ocp
        from reterm_jax.train.checkpointing import find_params_dir
        params_dir = find_params_dir(path)
        want_stacked = is_stacked(abs_params)
        read_abs, read_shardings = abs_params, param_shardings
        with ocp.StandardCheckpointer() as ckptr:
            stored_stacked = is_stacked(ckptr.metadata(params_dir).item_metadata.tree)
            if stored_stacked != want_stacked:  # written with the other model.scan_layers: read it as it is
                other = config.model.copy_and_resolve_references()
                other.scan_layers = stored_stacked
                _, _, read_abs, read_shardings = abstract_params(other, mesh)
            target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), read_abs,
                                  read_shardings)
            try:
                params = ckptr.restore(params_dir, target)
            except (ValueError, KeyError) as e:
                raise ValueError(f"init.checkpoint={path}: its params do not fit the configured model "
                                 f"(config.model must match the SFT run's): {e}") from e
        if stored_stacked != want_stacked:
            logging.info("init.checkpoint %s is %s: converting to the %s layout (model.scan_layers=%s)", path,
                         "stacked" if stored_stacked else "per layer", "stacked" if want_stacked else "per-layer",
                         want_stacked)
            params = relayout_params(params, stacked=want_stacked, out_shardings=param_shardings,
                                     period=len((abs_params if want_stacked else read_abs)["model"]["blocks"]))
    got = jax.tree.map(lambda x: tuple(x.shape), params)
    want = jax.tree.map(lambda x: tuple(x.shape), abs_params)
    if got != want:
        raise ValueError(f"init.checkpoint={path}: parameter shapes differ from the configured model")
    logging.info("warm start from %s", path)
    return params


def initial_params(config, workdir, model_config, mesh, abs_params, param_shardings):
    """Warm start (init.checkpoint, else the automatic SFT: of the tiny model, or of model.hf_path with
    init.sft_from_hf), model.hf_path as it is, or random init."""
    if config.init.from_scratch:
        model_cfg = config.model.copy_and_resolve_references()
        model_cfg.hf_path = ""  # random init even with an HF config (model_config is already built)
        return init_params(model_cfg, model_config, mesh, param_shardings, seed=config.seed)
    path = config.init.checkpoint
    if not path and config.model.hf_path and config.init.sft_from_hf:
        path = warm_start_sft(config, workdir)  # the SFT preset of the model's (smollm2) from model.hf_path
    elif not path and not config.model.hf_path:
        if config.model.preset != "tiny":
            raise ValueError("set --config.init.checkpoint=<SFT run>/checkpoints (or an HF dir) to warm-start from")
        path = warm_start_sft(config, workdir)
    if path:
        return load_warm_start(path, config, mesh, abs_params, param_shardings)
    logging.warning("no init.checkpoint: starting GRPO from model.hf_path=%s (not recovery-SFT'd)",
                    config.model.hf_path)
    return init_params(config.model, model_config, mesh, param_shardings, seed=config.seed)
