"""Files a training run writes besides its checkpoints: the run's config and the model's HF config
(at the start), and the final HF safetensors export (at the end). Shared by the SFT and GRPO loops."""
from __future__ import annotations

import json
import os
import shutil

import jax
from absl import logging
from flax import nnx

from reterm_jax.model.hf_io import save_pretrained

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def write_run_files(config, model_config, workdir: str, ckpt_dir: str) -> None:
    """The run's config (for the record) and the model's HF config next to the checkpoints
    (so `python -m reterm_jax.convert --to=hf --checkpoint=<ckpt_dir>` needs nothing else)."""
    if jax.process_index():
        return
    with open(os.path.join(workdir, "config.json"), "w") as fh:
        fh.write(config.to_json_best_effort(indent=2))
    if config.model.hf_path:
        shutil.copyfile(os.path.join(config.model.hf_path, "config.json"), os.path.join(ckpt_dir, "config.json"))
    else:
        hf = model_config.to_hf_text_dict()
        with open(os.path.join(ckpt_dir, "config.json"), "w") as fh:
            json.dump(hf, fh, indent=2)


def copy_tokenizer_files(tokenizer_dir: str, hf_dir: str) -> None:
    """The tokenizer files of `tokenizer_dir` that exist, into `hf_dir` (a self-contained HF dir)."""
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(tokenizer_dir, name)):
            shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(hf_dir, name))


def export_hf(config, graphdef, params, workdir: str, tokenizer_dir: str) -> str:
    """<workdir>/hf: the trained params as HF safetensors (vision/MTP tensors and config copied from
    `model.hf_path` when set; otherwise the tokenizer files are copied in, so the dir is
    self-contained). Returns the directory."""
    hf_dir = os.path.join(workdir, "hf")
    save_pretrained(nnx.merge(graphdef, params), hf_dir, source=config.model.hf_path or None)
    if not config.model.hf_path and jax.process_index() == 0:
        copy_tokenizer_files(tokenizer_dir, hf_dir)
    logging.info("exported HF checkpoint to %s", hf_dir)
    return hf_dir
