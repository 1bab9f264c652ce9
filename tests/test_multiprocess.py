"""Multi-host SFT on one machine: two local processes with two CPU devices each join one JAX
distributed system (through maybe_initialize's RETERM_* variables) and run the real trainer.

Checks: both processes see the same replicated losses; each process fed its own rows (the
pipeline shards by jax.process_index()); Orbax wrote the checkpoints collectively into the
shared workdir; and a single process with four devices, fed the same global batches (process 0's
row, then process 1's), gives the same losses. Cross-process collectives on CPU use gloo.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from multiprocess_utils import process_env, result, run_processes
from train_test_utils import ROOT, write_rows

from reterm_jax.parallel.distributed import detected_launcher, explicit_settings, maybe_initialize

STEPS = 3

# The trainer as `python -m reterm_jax.train` runs it, minus the flags: maybe_initialize() first,
# then sft.train. Mesh (data 1, fsdp 2, tensor 2): fsdp spans the two processes, so every step
# all-gathers params and reduce-scatters gradients across them; batch 2 = one row per process.
WORKER = """
import json, sys
sys.path.insert(0, "tests")
from absl import logging
logging.set_verbosity(logging.INFO)  # what app.run gives `python -m reterm_jax.train`
from reterm_jax.parallel.distributed import maybe_initialize
assert maybe_initialize()
import jax
from train_test_utils import small_config
from reterm_jax.train import sft
c = small_config(sys.argv[1], train__steps={steps}, train__batch_size=2, data__seq_len=1024)
c.mesh.fsdp, c.mesh.tensor = 2, 2
c.checkpoint.every = 1
c.train.export_hf = False
out = sft.train(c, sys.argv[2])
print("RESULT " + json.dumps({{"process": jax.process_index(), "count": jax.process_count(),
                              "devices": jax.device_count(), "losses": out["losses"]}}), flush=True)
"""

# The same model, optimizer and global batches in one process with four devices.
REFERENCE = """
import json, sys
sys.path.insert(0, "tests")
import jax, numpy as np
from train_test_utils import small_config
from reterm_jax.data import BASH_TOOL, load_and_validate, load_tokenizer, sft_dataset
from reterm_jax.data.tokenizer import TINY_TOKENIZER_DIR
from reterm_jax.parallel.mesh import make_mesh
from reterm_jax.train.optimizer import make_optimizer
from reterm_jax.train.state import abstract_params, create_train_state, init_params, train_state_shardings
from reterm_jax.train.step import make_train_step, put_batch
c = small_config(sys.argv[1], train__steps={steps}, train__batch_size=2, data__seq_len=1024)
mesh = make_mesh(1, 2, 2)
rows, _ = load_and_validate(c.data.path)
tok = load_tokenizer(TINY_TOKENIZER_DIR)
iters = [iter(sft_dataset(rows, tok, seq_len=c.data.seq_len, batch_size=1, seed=c.seed, num_epochs=None,
                          overlong=c.data.overlong, tools=[BASH_TOOL], shard_index=p, shard_count=2)[0])
         for p in range(2)]
optim = c.optim.copy_and_resolve_references()
optim.decay_steps = c.train.steps
tx, schedule = make_optimizer(optim)
model_config, graphdef, abs_params, param_sh = abstract_params(c.model, mesh)
shardings = train_state_shardings(tx, abs_params, param_sh, mesh)
state = create_train_state(init_params(c.model, model_config, mesh, param_sh, seed=c.seed), tx, shardings,
                           seed=c.seed)
step = make_train_step(graphdef, tx, schedule, micro_batches=1, mesh=mesh, shardings=shardings)
losses = {{}}
for s in range(1, c.train.steps + 1):
    parts = [next(it) for it in iters]
    batch = {{k: np.concatenate([p[k] for p in parts]) for k in parts[0]}}
    state, m = step(state, put_batch(batch, mesh))
    losses[s] = float(m["loss"])
print("RESULT " + json.dumps({{"losses": losses}}), flush=True)
"""


_env, _result = process_env, result


# --- which environments mean "several processes" (no JAX system is started here) -------------------

def test_explicit_variables_all_or_none():
    assert explicit_settings({}) is None
    assert explicit_settings({"RETERM_COORDINATOR": "10.0.0.2:8476", "RETERM_NUM_PROCESSES": "4",
                              "RETERM_PROCESS_ID": "3"}) == ("10.0.0.2:8476", 4, 3)
    with pytest.raises(ValueError, match="RETERM_PROCESS_ID not"):
        explicit_settings({"RETERM_COORDINATOR": "h:1", "RETERM_NUM_PROCESSES": "2"})
    with pytest.raises(ValueError, match="host:port"):
        explicit_settings({"RETERM_COORDINATOR": "h", "RETERM_NUM_PROCESSES": "2", "RETERM_PROCESS_ID": "0"})
    with pytest.raises(ValueError, match=r"must be in \[0, RETERM_NUM_PROCESSES=2\)"):
        explicit_settings({"RETERM_COORDINATOR": "h:1", "RETERM_NUM_PROCESSES": "2", "RETERM_PROCESS_ID": "2"})
    with pytest.raises(ValueError, match="must be an integer"):
        explicit_settings({"RETERM_COORDINATOR": "h:1", "RETERM_NUM_PROCESSES": "two", "RETERM_PROCESS_ID": "0"})


def test_launchers_count_only_when_they_start_several_processes():
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    assert detected_launcher({**slurm, "SLURM_NTASKS": "2"}) == "slurm"
    assert detected_launcher({**slurm, "SLURM_NTASKS": "1"}) is None  # srun of one task
    assert detected_launcher({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}) is None  # the batch step, not srun
    assert detected_launcher({"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1", "OMPI_COMM_WORLD_SIZE": "4"}) == "openmpi"
    assert detected_launcher({"TPU_WORKER_HOSTNAMES": "w0,w1"}) == "tpu"
    assert detected_launcher({"TPU_WORKER_HOSTNAMES": "w0"}) is None
    assert detected_launcher({}) is None


def test_single_process_environments_are_a_no_op():
    assert maybe_initialize({}) is False
    assert maybe_initialize({"RETERM_COORDINATOR": "h:1", "RETERM_NUM_PROCESSES": "1",
                             "RETERM_PROCESS_ID": "0"}) is False
    assert maybe_initialize({"RETERM_DISTRIBUTED": "0", "SLURM_NTASKS": "8"}) is False
    with pytest.raises(ValueError, match="RETERM_DISTRIBUTED='sometimes'"):
        maybe_initialize({"RETERM_DISTRIBUTED": "sometimes"})


# --- two processes, one machine ------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multiprocess")
    data = write_rows(str(tmp / "rows.jsonl"), 12)
    workdir = tmp / "run"
    outputs = run_processes(WORKER.format(steps=STEPS), [data, str(workdir)])
    return data, workdir, [_result(out) for out in outputs], outputs


@pytest.mark.slow
def test_both_processes_join_one_system_and_agree(two_process_run):
    _, _, results, _ = two_process_run
    assert [r["process"] for r in results] == [0, 1]
    assert all(r["count"] == 2 and r["devices"] == 4 for r in results)
    assert sorted(results[0]["losses"]) == list(range(1, STEPS + 1))
    assert results[0]["losses"] == results[1]["losses"]  # replicated metrics, bit for bit
    assert all(np.isfinite(v) and v > 0 for v in results[0]["losses"].values())


@pytest.mark.slow
def test_checkpoints_are_written_once_for_the_job(two_process_run):
    _, workdir, _, _ = two_process_run
    ckpt = workdir / "checkpoints"
    steps = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
    assert steps == [STEPS - 1, STEPS]  # keep=2 of every-step saves, finalised by both processes
    for item in ("params", "opt_state", "train"):
        assert (ckpt / str(STEPS) / item).is_dir(), f"{item} missing from {ckpt / str(STEPS)}"
    assert (ckpt / "config.json").is_file()  # written by process 0 only
    assert (workdir / "tb").is_dir()


@pytest.mark.slow
def test_only_process_zero_logs_info(two_process_run):
    _, _, _, outputs = two_process_run
    assert "joining a 2-process job as process 0" in outputs[0]
    assert "resumed" not in outputs[0]
    # process 1 announces itself, then drops to warnings: no per-step INFO lines from it
    assert "process 1 of 2" in outputs[1]
    assert "mesh {" in outputs[0] and "mesh {" not in outputs[1]


@pytest.mark.slow
def test_matches_one_process_with_four_devices(two_process_run):
    data, _, results, _ = two_process_run
    proc = subprocess.run([sys.executable, "-c", REFERENCE.format(steps=STEPS), data], cwd=ROOT, text=True,
                          capture_output=True, env=_env(4), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-6000:]
    reference = _result(proc.stdout)["losses"]
    multi = results[0]["losses"]
    assert sorted(reference) == sorted(multi)
    np.testing.assert_allclose([multi[s] for s in sorted(multi)], [reference[s] for s in sorted(reference)],
                               rtol=2e-5)
