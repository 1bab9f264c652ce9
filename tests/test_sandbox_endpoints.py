"""Sandboxes spread over several Docker endpoints (RETERM_DOCKER_HOSTS / SandboxPool(endpoints=)).

The real local engine is reached through two endpoint URLs: two unix-socket relays in front of
its socket, each recording the HTTP request lines that pass through it. So each request shows
which endpoint it took, and everything runs on the real engine.
"""
from __future__ import annotations

import os
import re
import socket
import threading

import pytest

from reterm_jax.sandbox import DockerSandbox, Limits, SandboxPool, load_task, verify
from reterm_jax.sandbox.client import client_kwargs, current_endpoint, docker_hosts, get_client, use_endpoint

BASE_IMAGE = os.environ.get("RETERM_BASE_IMAGE", "reterm/base:bookworm")
_REQUEST = re.compile(rb"(GET|POST|PUT|DELETE|HEAD) (/\S*) HTTP/1\.[01]\r\n")


def _engine_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        pytest.skip(f"the relays need the engine's unix socket; DOCKER_HOST={host}")
    return host[len("unix://"):]


class RecordingRelay:
    """unix:// endpoint that relays every connection to the engine's socket and records
    (method, path) of each request sent through it."""

    def __init__(self, path: str, target: str):
        self.url, self.target, self.requests = f"unix://{path}", target, []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self.target)
            threading.Thread(target=self._pump, args=(client, engine, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(engine, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while chunk := src.recv(1 << 16):
                if record:
                    with self._lock:
                        self.requests += [(m.decode(), p.decode()) for m, p in _REQUEST.findall(chunk)]
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def seen(self, method: str, fragment: str) -> int:
        """How many `method` requests had `fragment` in their path."""
        with self._lock:
            return sum(1 for m, p in self.requests if m == method and fragment in p)

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def relays(docker_client, tmp_path):
    target = _engine_socket()
    pair = [RecordingRelay(str(tmp_path / f"engine{i}.sock"), target) for i in range(2)]
    yield pair
    for r in pair:
        r.close()


# --- configuration (no engine needed) ------------------------------------------------------------

def test_hosts_variable_lists_endpoints_or_means_the_default_engine():
    assert docker_hosts({}) == [None]
    assert docker_hosts({"RETERM_DOCKER_HOSTS": " tcp://h1:2376, tcp://h2:2376 ,"}) == ["tcp://h1:2376",
                                                                                       "tcp://h2:2376"]
    with pytest.raises(ValueError, match="not an engine URL"):
        docker_hosts({"RETERM_DOCKER_HOSTS": "h1:2376"})
    with pytest.raises(ValueError, match="twice"):
        docker_hosts({"RETERM_DOCKER_HOSTS": "tcp://h1:2376,tcp://h1:2376"})


def test_tls_follows_the_docker_cli_for_tcp_endpoints_only(tmp_path):
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("not checked until a connection is made")
    env = {"DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(tmp_path), "DOCKER_HOST": "tcp://default:2376"}
    kw = client_kwargs("tcp://h2:2376", env)
    assert kw["base_url"] == "tcp://h2:2376"
    assert kw["tls"].verify is True and kw["tls"].ca_cert == str(tmp_path / "ca.pem")
    assert kw["tls"].cert == (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert "tls" not in client_kwargs("unix:///var/run/docker.sock", env)  # a local socket has no TLS
    assert client_kwargs(None, env)["base_url"] == "tcp://default:2376"      # None: DOCKER_HOST as is


def test_use_endpoint_is_scoped():
    assert current_endpoint() is None
    with use_endpoint("tcp://h1:2376"):
        assert current_endpoint() == "tcp://h1:2376"
        with use_endpoint("tcp://h2:2376"):
            assert current_endpoint() == "tcp://h2:2376"
        assert current_endpoint() == "tcp://h1:2376"
    assert current_endpoint() is None


# --- the real engine through two endpoints ---------------------------------------------------------

@pytest.mark.docker
def test_get_client_follows_use_endpoint_and_none_is_the_default_engine(relays):
    default = get_client()
    with use_endpoint(relays[0].url):
        via_relay = get_client()
        assert via_relay is not default and get_client(None) is default
        via_relay.ping()
    assert relays[0].seen("GET", "/_ping") >= 2  # the check when the client was made, and ours
    assert relays[1].seen("GET", "/_ping") == 0


@pytest.mark.docker
def test_pool_spreads_sandboxes_over_the_endpoints(relays):
    urls = [r.url for r in relays]
    all_started = threading.Barrier(4)

    def job(i):
        with DockerSandbox(BASE_IMAGE, limits=Limits(memory_mb=256, pids=128)) as sb:
            all_started.wait(timeout=300)  # all four in flight: the picks are A, B, A, B
            r = sb.exec(f"echo job {i}")
            assert r.ok and r.output == f"job {i}\n", r
            return current_endpoint(), sb.name

    with SandboxPool(4, endpoints=urls) as pool:
        outcomes = pool.map(job, range(4))
        assert pool.jobs_per_endpoint == {urls[0]: 2, urls[1]: 2}
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for endpoint, name in (o.value for o in outcomes):
        mine, other = relays if endpoint == urls[0] else relays[::-1]
        assert mine.seen("POST", f"/containers/create?name={name}") == 1
        assert mine.seen("DELETE", f"/containers/{name}") == 1
        assert other.seen("POST", name) == 0 and other.seen("DELETE", name) == 0


@pytest.mark.docker
def test_snapshot_branch_and_verify_stay_on_the_sandboxes_engine(relays, task_path):
    """Sandboxes started by pool jobs, then used from the main thread (as a rollout does from
    later jobs): commit, branch, the verifier's clone and removal all go to the engine the
    sandbox lives on, whatever endpoint the calling code has."""
    task = load_task(task_path("make_greeting"))
    urls = [r.url for r in relays]
    both_started = threading.Barrier(2)

    def start(_):
        sb = DockerSandbox.from_task(task, limits=Limits(memory_mb=256, pids=128))
        both_started.wait(timeout=300)
        sb.exec("echo 'hello, sandbox' > /app/greeting.txt")
        return sb, current_endpoint()

    with SandboxPool(2, endpoints=urls) as pool:
        outcomes = pool.map(start, range(2))
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    started = [o.value for o in outcomes]
    try:
        for sb, endpoint in started:
            mine, other = relays if endpoint == urls[0] else relays[::-1]
            with use_endpoint(other.url):  # the caller's endpoint must not matter
                assert verify(sb).reward == 1.0
                with sb.snapshot() as snap:
                    [branch] = snap.branch(1)
                    with branch:
                        assert branch.exec("cat /app/greeting.txt").output == "hello, sandbox\n"
            sb.close()
            assert mine.seen("POST", f"/commit?container={sb.id}") == 2  # verify's snapshot + ours
            assert mine.seen("POST", f"/containers/create?name={branch.name}") == 1
            assert mine.seen("DELETE", f"/containers/{branch.name}") == 1
            assert mine.seen("DELETE", f"/containers/{sb.name}") == 1
            assert other.seen("POST", sb.id) == 0 and other.seen("POST", branch.name) == 0
    finally:
        for sb, _ in started:
            sb.close()


def test_an_endpoint_without_an_engine_is_reported_with_its_url(tmp_path):
    from reterm_jax.sandbox import DockerUnavailable
    url = f"unix://{tmp_path}/nothing.sock"
    with pytest.raises(DockerUnavailable, match=re.escape(url)):
        get_client(url)
