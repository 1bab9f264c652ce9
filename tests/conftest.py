"""Shared pytest setup.

The model tests compare against transformers on the CPU in float32; JAX must not
silently use reduced-precision matmuls there. XLA compiles with less LLVM optimisation
(tests/xla_env.py says why); subprocesses inherit it.
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
sys.path.insert(0, os.path.dirname(__file__))  # tests/hf_reference.py and friends
from xla_env import with_test_flags  # noqa: E402 - needs the path above

os.environ["XLA_FLAGS"] = with_test_flags(os.environ.get("XLA_FLAGS", ""))
pytest_plugins = ["docker_fixtures"]
