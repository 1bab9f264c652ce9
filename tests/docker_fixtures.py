"""Pytest fixtures for tests that need the real Docker engine (registered in conftest).

Docker tests FAIL (not skip) when no engine answers, with the command that starts
one; set RETERM_SKIP_DOCKER=1 to skip them instead. Every Docker object made by this
test session (and its subprocesses, through RETERM_RUN_ID) carries one run id; at the
end of the session nothing with that id may be left.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

# Before reterm_jax.sandbox creates anything: subprocesses inherit the run id too.
os.environ.setdefault("RETERM_RUN_ID", f"pytest{uuid.uuid4().hex[:8]}")

TASKS_DIR = Path(__file__).parent / "data" / "tasks"
BASE_IMAGE = os.environ.get("RETERM_BASE_IMAGE", "reterm/base:bookworm")


def _leftovers(client) -> list[str]:
    from reterm_jax.sandbox import labels
    sel = labels.managed_filter(**{labels.RUN_ID: labels.run_id()})
    found = [f"container {c.name}" for c in client.containers.list(all=True, filters=sel)]
    snap = labels.managed_filter(labels.KIND_SNAPSHOT, **{labels.RUN_ID: labels.run_id()})
    found += [f"snapshot image {im.id[7:19]}" for im in client.images.list(filters=snap)]
    return found


@pytest.fixture(scope="session")
def docker_client():
    """The engine, checked once; at session end, asserts that nothing leaked."""
    if os.environ.get("RETERM_SKIP_DOCKER") == "1":
        pytest.skip("RETERM_SKIP_DOCKER=1")
    import docker
    from reterm_jax.sandbox.client import DockerUnavailable, get_client
    try:
        client = get_client()
    except DockerUnavailable as e:
        pytest.fail(f"{e}\n(set RETERM_SKIP_DOCKER=1 to skip the Docker tests)", pytrace=False)
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"base image {BASE_IMAGE} is missing: run `bash launch/build_base_image.sh`",
                    pytrace=False)
    yield client
    leaked = _leftovers(client)
    assert not leaked, f"the Docker tests leaked managed objects: {leaked}"


@pytest.fixture
def base_sandbox(docker_client):
    """A small sandbox on the base image, closed after the test."""
    from reterm_jax.sandbox import DockerSandbox, Limits
    sb = DockerSandbox(BASE_IMAGE, limits=Limits(cpus=1, memory_mb=512, pids=256))
    yield sb
    sb.close()


@pytest.fixture(scope="session")
def task_path():
    """task_path('make_greeting') -> the path of a tiny test task."""
    return lambda name: TASKS_DIR / name
