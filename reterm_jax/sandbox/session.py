"""A long-lived shell server per sandbox, reached through one `docker exec` session.

Why: a `docker exec` per command costs ~50 ms of engine and runc work on a small
machine; writing a request to an already-running bash costs ~1 ms. The server is a
bash loop started once with `docker exec -i`; the container's main process stays
`sleep infinity`, so if a command kills the server (`pkill bash`), the sandbox lives
on and the next command starts a new server.

Wire format (stdin of the server, one request = two lines):
    NONCE PERSIST TIMEOUT HEAD_BYTES MAX_FILE_BYTES\n
    COMMAND with `\\` -> `\\\\` and newline -> `\\n`\n       (decoded by printf %b, a builtin)
The reply on stdout is OUTER's reply (shell.py) followed by `NONCE\n`. The nonce is
random per request: it marks the end of a reply even when the reply is malformed,
and the agent cannot forge it.
"""
from __future__ import annotations

import secrets
import select
import socket
import struct
import time

import docker

SERVER = r'''
while IFS=' ' read -r nonce persist to head max && IFS= read -r line; do
  printf -v cmd '%b' "$line"
  bash -c "$1" reterm-exec "$cmd" "$persist" "$to" "$head" "$max" "$2" </dev/null 2>/dev/null
  printf '%s\n' "$nonce"
done
'''


class SessionBroken(Exception):
    """The server's stream ended (`stalled` False) or gave no reply in time (True)."""

    def __init__(self, message: str, *, stalled: bool = False):
        super().__init__(message)
        self.stalled = stalled


READY = b"reterm-server-ready\n"


class PreludeFailed(Exception):
    """The bash run before the server (ShellSession's `prelude`) failed: `exit_code` is its status."""

    def __init__(self, exit_code: int | None, cause: str = ""):
        super().__init__(f"the shell server's prelude failed (exit {exit_code})" + (f": {cause}" if cause else ""))
        self.exit_code = exit_code
        self.cause = cause  # what ended the stream before the server said it was ready


def _exit_code(api: docker.APIClient, exec_id: str, wait_s: float = 2.0) -> int | None:
    """An ended exec's exit status (the engine may report it a moment after its stream ends)."""
    deadline = time.monotonic() + wait_s
    while True:
        info = api.exec_inspect(exec_id)
        if not info.get("Running") or time.monotonic() >= deadline:
            return info.get("ExitCode")
        time.sleep(0.02)


class ShellSession:
    def __init__(self, api: docker.APIClient, container_id: str, outer: str, inner: str, *,
                 prelude: str = "", setup: str = "", ready_timeout_s: float = 120.0):
        """prelude: bash run in the server's process before it serves (silent on stdout; an exit
        ends it): the server starts only if it succeeds, else PreludeFailed.
        setup: bash run first, its output and status ignored (e.g. the sandbox's /etc/hosts)."""
        script = SERVER if not prelude else f"{prelude}\nprintf '%s' '{READY.decode()}'\n{SERVER}"
        if setup:
            script = f"{{ {setup}\n}} >/dev/null 2>&1\n{script}"
        argv = ["bash", "-c", script, "reterm-server", outer, inner]
        exec_id = api.exec_create(container_id, argv, stdin=True, stdout=True, stderr=False)["Id"]
        self._handle = api.exec_start(exec_id, socket=True)  # keeps the connection alive
        self._sock: socket.socket = getattr(self._handle, "_sock", self._handle)
        self._buf = b""
        if prelude:
            self._sock.settimeout(ready_timeout_s)
            try:
                while not self._buf.endswith(READY):
                    self._buf += self._next_stdout_frame()
            except (SessionBroken, OSError) as e:
                self.close()
                raise PreludeFailed(_exit_code(api, exec_id), f"{type(e).__name__}: {e}".rstrip(": ")) from None
            self._buf = b""

    def request(self, command: str, *, persist: bool, timeout_s: int, head_bytes: int,
                max_file_bytes: int, read_timeout_s: float) -> bytes:
        """Send one command; return OUTER's reply (without the nonce)."""
        nonce = secrets.token_hex(12)
        body = command.replace("\\", "\\\\").replace("\n", "\\n")
        msg = f"{nonce} {int(persist)} {timeout_s} {head_bytes} {max_file_bytes}\n{body}\n"
        end = f"{nonce}\n".encode()
        self._sock.settimeout(read_timeout_s)
        try:
            self._sock.sendall(msg.encode())
            while not self._buf.endswith(end):
                self._buf += self._next_stdout_frame()
        except socket.timeout as e:
            raise SessionBroken(f"no reply within {read_timeout_s:g} s", stalled=True) from e
        except OSError as e:
            raise SessionBroken(f"shell server connection failed: {e}") from e
        reply, self._buf = self._buf[: -len(end)], b""
        return reply

    def ended(self) -> bool:
        """True when the server has gone away since the last reply (e.g. a background job
        of an earlier command killed it): its stream is at EOF. Nothing else is ever
        pending between requests."""
        try:
            poller = select.poll()  # not select.select: it refuses socket numbers >= 1,024
            poller.register(self._sock, select.POLLIN)
            return bool(poller.poll(0)) and self._sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
        except TypeError:  # a transport without MSG_PEEK (ssh channel): cannot tell
            return False

    def _read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self._sock.recv(n - len(data))
            if not chunk:
                raise SessionBroken("the shell server's stream ended")
            data += chunk
        return data

    def _next_stdout_frame(self) -> bytes:
        # Docker multiplexes the non-tty stream: 8-byte header (stream, 0, 0, 0, size BE).
        stream, size = struct.unpack(">BxxxL", self._read_exactly(8))
        payload = self._read_exactly(size) if size else b""
        return payload if stream == 1 else b""

    def close(self) -> None:
        for obj in (self._sock, self._handle):
            try:
                obj.close()
            except Exception:  # noqa: BLE001 - closing a dead connection
                pass
