"""End-to-end SFT runs on a small model and short synthetic rows.

One uninterrupted CLI run (a subprocess, as a user would start it) is the reference for:
its own outputs (TensorBoard events, checkpoints, an HF export that transformers loads and that
reproduces our logits), a run stopped half-way and resumed with fresh objects (same losses),
and the same run on 8 fake CPU devices with a data=2, fsdp=2, tensor=2 mesh (same losses).
"""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from train_test_utils import ROOT, small_config, tb_scalars, write_rows
from xla_env import with_test_flags

STEPS = 4
OVERRIDES = ["--config.data.seq_len=1024", f"--config.train.steps={STEPS}", "--config.train.batch_size=4",
             "--config.train.log_every=1", "--config.checkpoint.every=2", "--config.optim.warmup_steps=1",
             "--config.optim.lr=0.01", "--config.model.overrides.hidden_size=32",
             "--config.model.overrides.intermediate_size=64", "--config.model.overrides.num_attention_heads=2",
             "--config.model.overrides.num_key_value_heads=1", "--config.model.overrides.head_dim=16",
             "--config.model.overrides.linear_num_key_heads=1", "--config.model.overrides.linear_num_value_heads=2",
             "--config.model.overrides.linear_key_head_dim=16", "--config.model.overrides.linear_value_head_dim=16"]


def _config(data):
    c = small_config(data)
    c.data.seq_len, c.train.steps, c.train.batch_size = 1024, STEPS, 4
    return c


def _tb_losses(tb_dir) -> dict[int, float]:
    return tb_scalars(tb_dir).get("train/loss", {})


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft")
    data = write_rows(str(tmp / "rows.jsonl"), 12)
    workdir = str(tmp / "run")
    cmd = [sys.executable, "-m", "reterm_jax.train", "--config=configs/sft.py", f"--config.data.path={data}",
           f"--workdir={workdir}", *OVERRIDES]
    # The in-process runs compared with this one start their backend without the CLI's XLA:CPU
    # flags (reterm_jax/cpu_flags.py), so this run goes without them too: same compiler, same rounding.
    env = dict(os.environ, JAX_PLATFORMS="cpu", RETERM_XLA_CPU_DEFAULTS="0")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"data": data, "workdir": workdir, "tmp": tmp}


def test_cli_writes_events_checkpoints_and_export(cli_run):
    workdir = cli_run["workdir"]
    assert glob.glob(os.path.join(workdir, "tb", "events.out.tfevents.*"))
    losses = _tb_losses(os.path.join(workdir, "tb"))
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1]
    steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert steps == [2, 4]
    for item in ("params", "opt_state", "train"):
        assert os.path.isdir(os.path.join(workdir, "checkpoints", "4", item))
    train = json.load(open(glob.glob(os.path.join(workdir, "checkpoints", "4", "train", "*"))[0]))
    assert train["step"] == 4 and "data_iterator" in train
    assert os.path.exists(os.path.join(workdir, "hf", "model.safetensors"))


def test_export_loads_in_transformers_and_reproduces_logits(cli_run):
    import jax.numpy as jnp
    import torch
    from transformers import Qwen3_5ForCausalLM
    from reterm_jax.convert import restore_model

    ours = restore_model(os.path.join(cli_run["workdir"], "checkpoints"))  # the step-4 params
    hf = Qwen3_5ForCausalLM.from_pretrained(os.path.join(cli_run["workdir"], "hf"), dtype=torch.float32).eval()
    ids = np.random.default_rng(0).integers(0, 1060, (2, 40))
    with torch.no_grad():
        want = hf(torch.as_tensor(ids)).logits.numpy()
    got = np.asarray(ours(jnp.asarray(ids, jnp.int32)))
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4)


def test_resume_reproduces_the_uninterrupted_losses(cli_run):
    from reterm_jax.train.sft import train
    workdir = str(cli_run["tmp"] / "resumed")
    first = train(_config(cli_run["data"]), workdir, stop_at_step=2)  # "killed" after step 2's checkpoint
    assert sorted(first["losses"]) == [1, 2]
    second = train(_config(cli_run["data"]), workdir)  # fresh mesh, data iterator, jit, manager
    assert sorted(second["losses"]) == [3, 4]
    reference = _tb_losses(os.path.join(cli_run["workdir"], "tb"))
    got = {**first["losses"], **second["losses"]}
    for step in range(1, STEPS + 1):
        np.testing.assert_allclose(got[step], reference[step], rtol=1e-6, err_msg=f"step {step}")
    # experiments/learning/learning_run's control with no SFT to measure a step by counts these batches beforehand
    sys.path.insert(0, os.path.join(ROOT, "experiments", "learning"))
    from learning_data import steps_for_tokens

    from reterm_jax.data.tokenizer import TINY_TOKENIZER_DIR
    count = lambda tokens: steps_for_tokens(cli_run["data"], TINY_TOKENIZER_DIR, seq_len=1024, batch_size=4,  # noqa: E731
                                            seed=_config(cli_run["data"]).seed, target_tokens=tokens)
    total = first["target_tokens"] + second["target_tokens"]
    assert count(total) == (STEPS, total)
    assert count(first["target_tokens"]) == (2, first["target_tokens"])
    assert count(first["target_tokens"] + 1)[0] == 3


_EIGHT_DEVICES = """
import json, os, sys
sys.path[:0] = [{tests!r}]
import jax
assert jax.device_count() == 8, jax.devices()
from train_test_utils import small_config
from reterm_jax.train.sft import train
c = small_config({data!r})
c.data.seq_len, c.train.steps, c.train.batch_size = 1024, {steps}, 4
c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
c.train.export_hf = False
print("LOSSES" + json.dumps(train(c, {workdir!r})["losses"]))
"""


def test_eight_devices_give_the_same_losses(cli_run):
    script = _EIGHT_DEVICES.format(tests=os.path.join(ROOT, "tests"), data=cli_run["data"], steps=STEPS,
                                   workdir=str(cli_run["tmp"] / "eight"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_test_flags("--xla_force_host_platform_device_count=8"))
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("LOSSES"))
    losses = {int(k): v for k, v in json.loads(line[len("LOSSES"):]).items()}
    reference = _tb_losses(os.path.join(cli_run["workdir"], "tb"))
    for step in range(1, STEPS + 1):
        np.testing.assert_allclose(losses[step], reference[step], rtol=1e-5, err_msg=f"step {step}")


def test_unknown_mode_names_the_available_ones(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "reterm_jax.train", "--config=configs/sft.py",
                           "--config.mode=dpo", f"--workdir={tmp_path}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode != 0
    assert "config.mode='dpo' is not implemented; available modes: ['grpo', 'sft']" in proc.stderr


def _truncate_largest(directory: str) -> str:
    files = [p for p in glob.glob(os.path.join(directory, "**", "*"), recursive=True) if os.path.isfile(p)]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as fh:
        fh.truncate(os.path.getsize(largest) // 2)
    return largest


def test_a_damaged_latest_checkpoint_is_set_aside_and_the_run_resumes_from_the_previous(cli_run):
    """The CLI run's checkpoints (steps 2 and 4) copied, step 4's largest params file cut in half:
    the run names step 4, moves it aside and resumes from step 2; steps 3-4 then give the
    uninterrupted run's losses. With step 2 damaged as well, one line says what to delete."""
    import shutil

    from reterm_jax.errors import UserError
    from reterm_jax.train.sft import train
    workdir = str(cli_run["tmp"] / "damaged")
    shutil.copytree(os.path.join(cli_run["workdir"], "checkpoints"), os.path.join(workdir, "checkpoints"))
    _truncate_largest(os.path.join(workdir, "checkpoints", "4", "params"))
    c = _config(cli_run["data"])
    c.train.export_hf = False
    got = train(c, workdir)["losses"]
    assert sorted(got) == [3, 4]
    reference = _tb_losses(os.path.join(cli_run["workdir"], "tb"))
    for step in (3, 4):
        np.testing.assert_allclose(got[step], reference[step], rtol=1e-6, err_msg=f"step {step}")
    aside = glob.glob(os.path.join(workdir, "checkpoints.unreadable", "4-*"))
    assert len(aside) == 1 and open(os.path.join(aside[0], "WHY.txt")).read().strip()
    # now 2 (damaged) and a fresh 4: damage both; nothing is moved, the error names the dir to delete
    for step in (2, 4):
        os.remove(os.path.join(workdir, "checkpoints", str(step), "train", "metadata"))
    with pytest.raises(UserError, match=r"no checkpoint in .*checkpoints can be restored .* delete .*checkpoints"):
        train(c, workdir)
    assert sorted(d for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()) == ["2", "4"]


def test_a_run_from_another_directory_finds_everything_in_the_package(tmp_path):
    """`--config=<checkout>/configs/sft.py` started from a directory outside the checkout: the
    preset's data, tokenizer and model come from the installed package, never from the cwd or
    the checkout's root (an installed package runs the same way)."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = subprocess.run([sys.executable, "-m", "reterm_jax.train", f"--config={ROOT}/configs/sft.py",
                           "--config.train.steps=2", "--config.checkpoint.every=2", f"--workdir={tmp_path / 'w'}"],
                          cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", RETERM_XLA_CPU_DEFAULTS="0"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert os.path.isfile(tmp_path / "w" / "hf" / "model.safetensors")
    assert not os.listdir(cwd)  # nothing lands in the cwd
