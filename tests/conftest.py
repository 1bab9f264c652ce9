"""Shared pytest setup.

The model tests compare against transformers on the CPU in float32; JAX must not
silently use reduced-precision matmuls there. XLA compiles with less LLVM optimisation
(tests/xla_env.py says why); subprocesses inherit it.
"""
import os
import sys

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
sys.path.insert(0, os.path.dirname(__file__))  # tests/hf_reference.py and friends
from xla_env import with_test_flags  # noqa: E402 - needs the path above

os.environ["XLA_FLAGS"] = with_test_flags(os.environ.get("XLA_FLAGS", ""))
pytest_plugins = ["docker_fixtures"]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group marks into the node ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`, what launch/test.sh runs) every test that touches
    the Docker engine runs on one worker, in order: some restart or stop the engine, all share the
    session's run id (RETERM_RUN_ID) and its end-of-session leak check. The other tests go to the
    workers a file at a time, so a module-scoped fixture (a training run, a two-process job) is
    built once, not once per worker. Without xdist the group marks do nothing."""
    for item in items:
        if item.get_closest_marker("docker") or "docker_client" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("docker"))
        else:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
