"""Shared helpers of the multi-process tests: N local CPU processes (fake devices each) joining
one JAX distributed system through maybe_initialize's RETERM_* variables."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from train_test_utils import ROOT
from xla_env import with_test_flags


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(devices: int, **extra) -> dict:
    """This environment minus any launcher's variables, on `devices` fake CPU devices."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RETERM_COORDINATOR", "RETERM_NUM_PROCESSES",
                                                                   "RETERM_PROCESS_ID", "SLURM_", "OMPI_"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=with_test_flags(f"--xla_force_host_platform_device_count={devices}"),
               JAX_DEFAULT_MATMUL_PRECISION="highest", PYTHONPATH=ROOT, **extra)
    return env


def result(stdout: str) -> dict:
    """The last `RESULT {json}` line of a worker's output; "losses" keys back to ints."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, "no RESULT line"
    out = json.loads(lines[-1][len("RESULT "):])
    if "losses" in out:
        out["losses"] = {int(k): v for k, v in out["losses"].items()}
    return out


def run_processes(script: str, args: list[str], *, processes: int = 2, devices: int = 2,
                  timeout: float = 1200) -> list[str]:
    """Runs `python -c script *args` as `processes` processes of one job; their outputs (stdout +
    stderr), after asserting every one exited 0. timeout: a hang guard, not a speed check."""
    coordinator = f"localhost:{free_port()}"
    procs = [subprocess.Popen(
        [sys.executable, "-c", script, *args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=process_env(devices, RETERM_COORDINATOR=coordinator, RETERM_NUM_PROCESSES=str(processes),
                        RETERM_PROCESS_ID=str(i)))
        for i in range(processes)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {i} failed (rc {p.returncode}):\n{out[-6000:]}"
    return outputs
