"""A Docker engine that stops answering and comes back, as the sandbox code sees it.

The engine is reached through a unix-socket proxy to the real engine that the test can take down
(listener closed, every open connection cut, socket file gone) and bring back, so the outage is
real on the client side without stopping the engine the rest of the suite uses. Checked: waiting
for the engine (back-off, one warning when it starts, one line when it answers again, stopping
early), recognising engine-down errors, and removing the containers whose removal failed during
the outage once the engine answers again."""
from __future__ import annotations

import logging
import os
import socket
import socketserver
import threading
import time

import pytest

from reterm_jax.sandbox.client import engine_answers, is_engine_down, use_endpoint, wait_for_engine

pytestmark = pytest.mark.docker
ENGINE_SOCKET = "/var/run/docker.sock"


class EngineProxy:
    def __init__(self, path: str):
        self.path, self.server, self.conns = path, None, []

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def up(self) -> None:
        proxy = self

        class Pump(socketserver.BaseRequestHandler):
            def handle(self):
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(ENGINE_SOCKET)
                proxy.conns += [self.request, upstream]

                def copy(src, dst):
                    try:
                        while data := src.recv(65536):
                            dst.sendall(data)
                    except OSError:
                        pass
                    for s in (src, dst):
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                t = threading.Thread(target=copy, args=(upstream, self.request), daemon=True)
                t.start()
                copy(self.request, upstream)
                t.join(5)

        self.server = socketserver.ThreadingUnixStreamServer(self.path, Pump)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.conns = []
        os.unlink(self.path)


@pytest.fixture
def proxy(tmp_path, docker_client):
    p = EngineProxy(str(tmp_path / "engine.sock"))
    p.up()
    yield p
    if p.server is not None and os.path.exists(p.path):
        p.down()


def test_waiting_for_an_engine_that_comes_back(proxy, caplog):
    assert engine_answers(proxy.url)
    proxy.down()
    assert not engine_answers(proxy.url)
    assert not wait_for_engine(endpoint=proxy.url, first_delay_s=0.1, timeout_s=0.5)  # gives up: False
    threading.Timer(1.5, proxy.up).start()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        t0 = time.monotonic()
        assert wait_for_engine(endpoint=proxy.url, what="worker 0", first_delay_s=0.2, max_delay_s=0.4)
    assert 1.4 < time.monotonic() - t0 < 10
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "does not answer" in lines[0] and "answers again" in lines[1], lines
    assert "worker 0" in lines[0] and proxy.url.split("://")[1] in lines[0]
    # a stop request ends the wait at once
    proxy.down()
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    assert not wait_for_engine(stop, endpoint=proxy.url, first_delay_s=5.0)
    assert time.monotonic() - t0 < 4


def test_containers_that_could_not_be_removed_in_an_outage_are_removed_after_it(proxy, docker_client):
    import docker

    from reterm_jax.sandbox import DockerSandbox
    from reterm_jax.sandbox.sandbox import _unremoved, remove_leftovers
    from docker_fixtures import BASE_IMAGE
    with use_endpoint(proxy.url):
        sb = DockerSandbox(BASE_IMAGE)
        assert sb.exec("echo hi").output.strip() == "hi"
        proxy.down()
        err = sb.exec("echo again")
        assert not err.ok
        try:
            from reterm_jax.sandbox.client import get_client
            get_client(proxy.url).ping()
        except Exception as e:  # noqa: BLE001 - the error a worker would see
            assert is_engine_down(e)
        sb.close()  # cannot remove it now
    assert sb.name in _unremoved
    docker_client.containers.get(sb.name)  # still there (the real engine kept it)
    assert remove_leftovers() == 1  # the proxy is still down: left, and said so
    proxy.up()
    assert remove_leftovers() == 0
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(sb.name)
