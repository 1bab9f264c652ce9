"""Multi-host GRPO on one machine: two local processes with two CPU devices each run the real
GRPO trainer (synthetic environment, inline sampling) as one JAX job.

Each process samples its own group per step (groups_per_step=2 over 2 processes) with a full,
host-local copy of the params the PolicyStore gathers after every step; the global batch is
assembled from both processes' rows. Checks: both processes finish with the same (replicated)
losses and the same policy version; the checkpoint holds both processes' stream states and
per-process fields; and a run stopped at step 2 resumes there and finishes the job.
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from multiprocess_utils import result, run_processes

STEPS = 3
STOP = 2

WORKER = """
import json, sys
sys.path.insert(0, "tests")
from absl import logging
logging.set_verbosity(logging.INFO)
from reterm_jax.parallel.distributed import maybe_initialize
assert maybe_initialize()
import jax
from test_grpo_train import synthetic_config
from reterm_jax.rl.grpo import loop as grpo
from reterm_jax.rl.grpo.rollout import rollout_seed
c = synthetic_config({steps})
c.model.overrides.num_hidden_layers = 2
c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 2, 2   # fsdp spans the two processes
c.stream.groups_per_step = 2                       # one group per process per step
c.checkpoint.every = 1
stop = int(sys.argv[2]) or None
out = grpo.train(c, sys.argv[1], stop_at_step=stop)
resumed = out["resumed"]
print("RESULT " + json.dumps({{"process": jax.process_index(), "count": jax.process_count(),
                              "losses": out["losses"], "rewards": out["rewards"], "last_step": out["last_step"],
                              "policy_version": out["policy_version"], "seed": rollout_seed(c.seed, 0),
                              "resumed": None if resumed is None else {{"step": resumed["step"],
                                                                      "policy_version": resumed["policy_version"],
                                                                      "stream": resumed["stream"]}}}}),
      flush=True)
"""


def _train_json(workdir, step):
    return json.load(open(glob.glob(os.path.join(workdir, "checkpoints", str(step), "train", "*"))[0]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("grpo_multiprocess") / "run")
    script = WORKER.format(steps=STEPS)
    first = run_processes(script, [workdir, str(STOP)], timeout=900)
    saved = _train_json(workdir, STOP)
    second = run_processes(script, [workdir, "0"], timeout=900)
    return workdir, [result(o) for o in first], [result(o) for o in second], saved, first + second


@pytest.mark.slow
def test_both_processes_train_in_step(runs):
    _, first, _, _, _ = runs
    assert [r["process"] for r in first] == [0, 1] and all(r["count"] == 2 for r in first)
    assert all(r["last_step"] == STOP and r["resumed"] is None for r in first)
    assert sorted(first[0]["losses"]) == list(range(1, STOP + 1))
    assert first[0]["losses"] == first[1]["losses"]           # replicated metrics, bit for bit
    assert first[0]["rewards"] == first[1]["rewards"]         # the stream stats are all-reduced
    assert all(np.isfinite(v) for v in first[0]["losses"].values())
    assert first[0]["policy_version"] == first[1]["policy_version"] == STOP
    assert first[0]["seed"] != first[1]["seed"]               # each process samples its own rollouts


@pytest.mark.slow
def test_the_checkpoint_holds_every_process_state(runs):
    _, _, _, saved, _ = runs
    assert saved["policy_version"] == STOP
    assert len(saved["data_iterators"]) == 2                  # one stream state per process
    for state in saved["data_iterators"]:
        assert state["batches"] == STOP and state["pulls"] >= STOP
    assert saved["process_extras"] == [{"bank": None}, {"bank": None}]  # synthetic: no failure bank


@pytest.mark.slow
def test_a_stopped_run_resumes_on_both_processes(runs):
    _, _, second, saved, _ = runs
    for p, r in enumerate(second):
        assert r["resumed"]["step"] == STOP and r["resumed"]["policy_version"] == STOP
        assert r["resumed"]["stream"] == saved["data_iterators"][p]   # its own stream state back
        assert r["last_step"] == STEPS and r["policy_version"] == STEPS
        assert sorted(r["losses"]) == list(range(STOP + 1, STEPS + 1))
    assert second[0]["losses"] == second[1]["losses"]


@pytest.mark.slow
def test_only_process_zero_logs_progress(runs):
    _, _, _, _, outputs = runs
    assert "step 1:" in outputs[0] and "step 1:" not in outputs[1]
