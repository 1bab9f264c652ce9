"""XLA:CPU compiler defaults for `python -m reterm_jax.train` in SFT mode.

jaxlib 0.10.2's XLA:CPU fuses a train step's dots, elementwise ops and reductions into YNNPACK
calls, and its reduce fusions are slow: with `--xla_cpu_experimental_ynn_fusion_type=dot` (only
dots go to YNNPACK) the same SFT step (bench/train_step.py --size medium) takes 0.63x (Intel Xeon)
to 0.76x (AMD EPYC) the time on the 2-core machines we measure on (docs/performance.md, "Train
step and XLA:CPU's YNNPACK fusion types"). XLA reads its flags once, from the XLA_FLAGS
environment variable, when the first backend starts; an entry a jaxlib does not know aborts the
process. So the flag is added only

- for a jaxlib version it was measured on (`KNOWN`; any other version gets nothing),
- when XLA_FLAGS does not already say something about the same option (the user's word wins),
- unless RETERM_XLA_CPU_DEFAULTS=0,
- before the backend has started (after that XLA would not read it: nothing is changed).

The flag touches only XLA:CPU's compiler, so it changes nothing on a GPU or TPU backend. GRPO
runs do not get it: their CPU time is mostly the sampler's decode loop, where one run with and one
without it gave mixed per-token times (docs/performance.md), so nothing is claimed there.
"""
from __future__ import annotations

import os

# jaxlib version -> XLA flags measured to speed up CPU training on it
KNOWN: dict[str, tuple[str, ...]] = {
    "0.10.2": ("--xla_cpu_experimental_ynn_fusion_type=dot",),
}
OPT_OUT = "RETERM_XLA_CPU_DEFAULTS"


def option(flag: str) -> str:
    """An XLA flag's option name: `--xla_x=1` -> `--xla_x`."""
    return flag.split("=", 1)[0]


def unset_flags(flags, xla_flags: str) -> list[str]:
    """Those of `flags` whose option `xla_flags` (an XLA_FLAGS string) does not set: the user's word wins."""
    present = {option(f) for f in xla_flags.split()}
    return [f for f in flags if option(f) not in present]


def cpu_flags_for(jaxlib_version: str, xla_flags: str) -> list[str]:
    """The flags of KNOWN[jaxlib_version] that `xla_flags` (the current XLA_FLAGS) does not set."""
    return unset_flags(KNOWN.get(jaxlib_version, ()), xla_flags)


def _backend_started() -> bool:
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge._backends)  # noqa: SLF001 - no public "has a backend started" query
    except Exception:  # noqa: BLE001 - unknown internals: assume started, change nothing
        return True


def apply_cpu_defaults() -> list[str]:
    """Append the flags (see the module docstring) to XLA_FLAGS; returns what was added."""
    if os.environ.get(OPT_OUT, "1") == "0":
        return []
    try:
        import jaxlib
        version = jaxlib.__version__
    except Exception:  # noqa: BLE001
        return []
    current = os.environ.get("XLA_FLAGS", "")
    added = cpu_flags_for(version, current)
    if not added or _backend_started():
        return []
    os.environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
    return added
