"""XLA flags for the test processes: the pytest process itself and the subprocesses tests start.

Most of the suite's time is XLA:CPU compiling small programs that then run for milliseconds, and
most of a compile is LLVM optimising the generated code. The tests therefore compile with
`--xla_backend_optimization_level=0`: the same HLO passes, fusion and buffer assignment (so
`memory_analysis()` does not change) and the same IEEE arithmetic (no fast-math at any level),
with less time spent making the machine code fast. Measured on a 2-core AMD EPYC:
tests/test_scan_decoder.py's three scan-vs-loop tests 108 -> 65 s; flash, delta-rule, vocab-chunk
and cache-attention tests 287 -> 204 s. A test whose time is running, not compiling, pays for it
(the 300-step SFT run: 126 -> 253 s): such a test starts its subprocess with `optimized_env`.

RETERM_TEST_XLA_DEFAULTS=1 runs everything with XLA's own optimisation level.
"""
from __future__ import annotations

import os

from reterm_jax.cpu_flags import unset_flags

FAST_COMPILE = "--xla_backend_optimization_level=0"
OPT_OUT = "RETERM_TEST_XLA_DEFAULTS"


def with_test_flags(xla_flags: str) -> str:
    """`xla_flags` plus the fast-compile flag, unless it sets that option already or the user opted out."""
    if os.environ.get(OPT_OUT) == "1" or not unset_flags([FAST_COMPILE], xla_flags):
        return xla_flags
    return f"{xla_flags} {FAST_COMPILE}".strip()


def optimized_env(**extra: str) -> dict:
    """This process's environment without the fast-compile flag: for a subprocess whose time is
    spent running compiled code (many training steps), as a user's run compiles it."""
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != FAST_COMPILE)
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags, **extra)
