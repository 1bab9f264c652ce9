"""The tiny preset overfits the bundled demo data: training loss falls by >= 90%.

Runs the default command line (`configs/sft.py`, 300 steps, ~2 min on 2 CPU cores), hence slow; compiled
as a user's run is (optimized_env), since its time is the steps, not the compile.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from test_train_run import _tb_losses
from train_test_utils import ROOT
from xla_env import optimized_env


@pytest.mark.slow
def test_tiny_preset_drives_demo_loss_down_by_90_percent(tmp_path):
    workdir = str(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-m", "reterm_jax.train", "--config=configs/sft.py",
                           f"--workdir={workdir}", "--config.checkpoint.every=300"],
                          cwd=ROOT, env=optimized_env(), capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = _tb_losses(os.path.join(workdir, "tb"))
    assert len(losses) == 300
    first = losses[1]
    last = float(np.mean([losses[s] for s in range(291, 301)]))  # batch of 1 row: average the noise
    assert first > 6.0, first  # ~ln(1060) at random init
    assert last <= 0.1 * first, (first, last)
