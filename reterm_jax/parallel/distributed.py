"""Multi-host start-up: join the JAX distributed system when the environment says this process
is one of several, and do nothing on a single process.

    from reterm_jax.parallel.distributed import maybe_initialize
    maybe_initialize()          # first thing in main, before anything touches a device

Which environments count as "several processes" (first match wins):

1. RETERM_DISTRIBUTED=0: never initialise (e.g. to debug one worker on its own).
2. RETERM_COORDINATOR / RETERM_NUM_PROCESSES / RETERM_PROCESS_ID, all three or none
   (host:port of process 0's coordinator service, the process count, this process's id).
   A count of 1 is a single process. Each process sees all its host's devices (JAX's cluster
   detection is switched off). launch/slurm.sbatch and the multi-process test use these.
3. RETERM_DISTRIBUTED=auto: `jax.distributed.initialize()` with no arguments, so JAX's own
   cluster detection (Cloud TPU VM metadata / GKE, SLURM, Open MPI, Kubernetes) supplies
   everything. launch/tpu_pod.sh sets it: on a TPU VM the worker list comes from the metadata
   server and no variable marks a pod slice.
4. Without any of those, the launchers JAX itself detects, when they say "more than one":
   SLURM under `srun` (SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_PROCID, SLURM_LOCALID and
   SLURM_NTASKS > 1), Open MPI's `mpirun` (OMPI_MCA_orte_hnp_uri, OMPI_COMM_WORLD_SIZE > 1),
   and TPU environments that name their workers (TPU_WORKER_HOSTNAMES with more than one host,
   or MEGASCALE_COORDINATOR_ADDRESS for multi-slice). On GPUs JAX then gives each process the
   one device numbered by its local rank: launch one process per GPU (srun --ntasks-per-node=
   GPUs), or use (2) for one process per node.

JAX's own variables still apply underneath (JAX_COORDINATOR_PORT, JAX_LOCAL_DEVICE_IDS,
JAX_COORDINATOR_BIND_ADDRESS). Cross-process collectives on CPU devices use gloo (JAX's default
`jax_cpu_collectives_implementation` on jax 0.10), which the multi-process test relies on.

After joining, processes other than 0 log warnings and errors only (absl), so the console shows
one copy of every message; set RETERM_LOG_ALL_PROCESSES=1 to keep them all.
"""
from __future__ import annotations

import os

import jax
from absl import logging

EXPLICIT_VARS = ("RETERM_COORDINATOR", "RETERM_NUM_PROCESSES", "RETERM_PROCESS_ID")
_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


def _int_var(env, name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} must be an integer") from None


def _more_than_one(env, name: str) -> bool:
    try:
        return int(env.get(name, "1")) > 1
    except ValueError:
        return False  # not ours to validate; JAX reports it if it gets that far


def explicit_settings(env=os.environ) -> tuple[str, int, int] | None:
    """(coordinator, num_processes, process_id) from the RETERM_* variables, or None when none is
    set. Half-set or malformed values are an error that names what to fix."""
    present = [v for v in EXPLICIT_VARS if env.get(v, "") != ""]
    if not present:
        return None
    missing = [v for v in EXPLICIT_VARS if v not in present]
    if missing:
        raise ValueError(f"{', '.join(present)} set but {', '.join(missing)} not: a multi-process job needs all of "
                         f"{', '.join(EXPLICIT_VARS)} (coordinator host:port, process count, this process's id "
                         "0..count-1), or none of them")
    coordinator = env["RETERM_COORDINATOR"]
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"RETERM_COORDINATOR={coordinator!r} must be host:port of process 0 (e.g. 10.0.0.2:8476)")
    num, pid = _int_var(env, "RETERM_NUM_PROCESSES"), _int_var(env, "RETERM_PROCESS_ID")
    if num < 1 or not 0 <= pid < num:
        raise ValueError(f"RETERM_PROCESS_ID={pid} must be in [0, RETERM_NUM_PROCESSES={num}) and the count >= 1")
    return coordinator, num, pid


def detected_launcher(env=os.environ) -> str | None:
    """The multi-process launcher JAX can bootstrap from on its own, or None (see the module doc)."""
    if all(v in env for v in _SLURM_VARS) and _more_than_one(env, "SLURM_NTASKS"):
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in env and _more_than_one(env, "OMPI_COMM_WORLD_SIZE"):
        return "openmpi"
    if len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]) > 1:
        return "tpu"
    if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu-multislice"
    return None


def maybe_initialize(env=os.environ) -> bool:
    """Join the distributed system if the environment describes a multi-process job; idempotent.
    Returns whether this process is part of an initialised distributed system. Must run before
    the first JAX computation (JAX raises otherwise)."""
    if jax.distributed.is_initialized():
        return True
    mode = env.get("RETERM_DISTRIBUTED", "").strip().lower()
    if mode in ("0", "false", "no", "off"):
        logging.info("RETERM_DISTRIBUTED=%s: running as a single process", mode)
        return False
    if mode not in ("", "auto", "1", "true", "yes", "on"):
        raise ValueError(f"RETERM_DISTRIBUTED={mode!r}: use 'auto' (let JAX detect the cluster) or '0' (never)")
    explicit = explicit_settings(env)
    if explicit is not None:
        coordinator, num, pid = explicit
        if num == 1:
            logging.info("RETERM_NUM_PROCESSES=1: running as a single process")
            return False
        logging.info("joining a %d-process job as process %d (coordinator %s)", num, pid, coordinator)
        # No cluster detection on top: under srun it would narrow each process to the one GPU
        # numbered SLURM_LOCALID, while a process per node should see all of the node's devices
        # (JAX_LOCAL_DEVICE_IDS still narrows them when set).
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num, process_id=pid,
                                   cluster_detection_method="deactivate")
    elif mode:
        logging.info("RETERM_DISTRIBUTED=%s: jax.distributed.initialize() detects the cluster", mode)
        jax.distributed.initialize()
    elif (launcher := detected_launcher(env)) is not None:
        logging.info("%s job detected: jax.distributed.initialize() takes its settings from it", launcher)
        jax.distributed.initialize()
    else:
        return False
    logging.info("process %d of %d: %d local devices, %d in all", jax.process_index(), jax.process_count(),
                 jax.local_device_count(), jax.device_count())
    if jax.process_index() != 0 and env.get("RETERM_LOG_ALL_PROCESSES", "") not in ("1", "true"):
        logging.set_verbosity(logging.WARNING)
    return True
