"""DockerSandbox: one isolated container that runs bash commands under the harness contract.

    sb = DockerSandbox.from_task(load_task("tasks/foo"))
    r = sb.exec("cd /app && export X=1 && ls", timeout=30)   # ExecResult
    snap = sb.snapshot()                                      # filesystem + cwd/env
    a, b = snap.branch(2)                                     # independent copies
    sb.close(); a.close(); b.close(); snap.release()

Commands reach a long-lived bash server in the container (session.py; one `docker
exec` per sandbox, not per command), which runs each one through shell.py's wrapper.
The container's main process is `sleep infinity` under Docker's init, so background
jobs are reaped and a command that kills the shell does not kill the sandbox.

Isolation: no network but loopback unless the task allows internet (networking disabled: Docker's
"none" without its network setup; /etc/hosts as "none" has it); all capabilities dropped
but the few bash/apt/dpkg need as root inside (CAPS); no-new-privileges; no
privileged mode; pids, memory and CPU limits. Everything is labelled (labels.py).
"""
from __future__ import annotations

import atexit
import dataclasses
import io
import math
import os
import shlex
import stat
import tarfile
import threading
import time
import uuid
from pathlib import Path

import docker
import requests

from reterm_jax.sandbox import labels, shell
from reterm_jax.sandbox.client import SandboxError, current_endpoint, get_client, retry
from reterm_jax.sandbox.session import PreludeFailed, SessionBroken, ShellSession
from reterm_jax.sandbox.shell import ExecResult
from reterm_jax.sandbox.task import Task

# Root inside the container still needs these for ordinary work: chown/chmod of files it
# does not own (CHOWN, DAC_OVERRIDE, FOWNER, FSETID), apt dropping to the _apt user and
# su/runuser (SETUID, SETGID), killing processes of other users (KILL), servers binding
# ports < 1024 on the loopback (NET_BIND_SERVICE). Not granted: NET_RAW, MKNOD,
# SYS_CHROOT, SETPCAP, SETFCAP, AUDIT_WRITE and everything Docker drops anyway.
CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL",
        "NET_BIND_SERVICE"]
INTERNET_NETWORK = "reterm_jax-internet"


@dataclasses.dataclass(frozen=True)
class Limits:
    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 1024
    allow_internet: bool = False
    storage_mb: int = 0  # writable-layer limit, enforced by a watchdog (0: none); see DockerSandbox.exec
    # OCI runtime: "" = the engine's default (runc), "runsc" = gVisor (docs/sandbox.md). Default:
    # $RETERM_SANDBOX_RUNTIME, which `use_runtime` sets from the config's sandbox.runtime.
    runtime: str = dataclasses.field(default_factory=lambda: default_runtime())

    @classmethod
    def from_task(cls, task: Task, pids: int = 1024) -> "Limits":
        return cls(cpus=task.cpus, memory_mb=task.memory_mb, pids=pids,
                   allow_internet=task.allow_internet, storage_mb=task.storage_mb)


RUNTIME_VAR = "RETERM_SANDBOX_RUNTIME"
BASE_IMAGE = os.environ.get("RETERM_BASE_IMAGE", "reterm/base:bookworm")  # the probe's image
RUNTIMES = ("runc", "runsc")


def default_runtime() -> str:
    """$RETERM_SANDBOX_RUNTIME, "" for the engine's default (unset or "runc")."""
    value = os.environ.get(RUNTIME_VAR, "").strip()
    return "" if value in ("", "runc") else value


def use_runtime(name: str) -> None:
    """Start this process's sandboxes (and its subprocesses') under `name`: "runc" (the engine's
    default) or "runsc" (gVisor). Raises SandboxError with the fix when the engine does not know it."""
    name = (name or "runc").strip()
    if name not in RUNTIMES:
        raise SandboxError(f"sandbox runtime {name!r}: use one of {', '.join(RUNTIMES)}")
    if name != "runc":
        known = get_client().info().get("Runtimes") or {}
        if name not in known:
            raise SandboxError(f"sandbox runtime {name!r} is not registered with the Docker engine (it knows "
                               f"{', '.join(sorted(known)) or 'none'}); register gVisor with "
                               "`RETERM_RUNSC=1 bash launch/setup.sh`")
        problem = runtime_problem(name)
        if problem:
            raise SandboxError(problem)
    os.environ[RUNTIME_VAR] = name


def use_config_runtime(config) -> None:
    """use_runtime(config.sandbox.runtime) for a run's config (GRPO, evaluate); a refusal is the
    user's one-line error naming the field."""
    from reterm_jax.errors import UserError
    runtime = config.sandbox.runtime
    try:
        use_runtime(runtime)
    except SandboxError as e:
        raise UserError(f"--config.sandbox.runtime={runtime}: {e}") from None


_PROBE = "ls / >/dev/null && stat / >/dev/null && echo probe-ok"
_probed: dict[tuple, str] = {}


def runtime_problem(name: str, image: str = BASE_IMAGE) -> str:
    """"" when a sandbox under `name` runs the basic tools an agent needs (`ls`, `stat`), else why
    not (cached per engine and runtime). Debian bookworm's gVisor (runsc 0.0~20221219) fails
    here: its statx rejects what bookworm's coreutils ask for, so every `ls` says "Invalid argument"."""
    key = (current_endpoint(), name, image)
    if key not in _probed:
        client = get_client()
        try:
            out = client.containers.run(image, ["sh", "-c", _PROBE], runtime=name, network_mode="none",
                                        remove=True, labels=labels.labels(labels.KIND_CONTAINER))
            _probed[key] = "" if b"probe-ok" in out else f"sandbox runtime {name!r}: `{_PROBE}` printed {out[-200:]!r}"
        except docker.errors.ContainerError as e:
            said = (e.stderr or b"").decode(errors="replace").strip().splitlines()
            _probed[key] = (f"sandbox runtime {name!r} cannot run basic tools here (`{_PROBE}`: "
                            f"{said[-1] if said else f'exit {e.exit_status}'}); this gVisor is too old for the "
                            "image's coreutils: install a newer runsc, or use runc")
        except docker.errors.DockerException as e:
            _probed[key] = f"sandbox runtime {name!r} cannot start a container here: {str(e)[-300:]}"
    return _probed[key]


def _tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# Written into a container's rootfs before it starts (one put_archive at "/"):
_KEEP_TMP = {"tmp/.reterm-keep": b"keeps /tmp on the container's rootfs under gVisor (runsc)\n"}
# An offline sandbox is created with networking disabled rather than on network "none": the same
# loopback-only namespace, without Docker's network setup (a `libnetwork-setkey` hook process and
# the sandbox's network endpoint per container: ~0.12 s of wall and ~0.15 s of CPU a start on 2
# cores, docs/performance.md). Docker then writes no /etc/hosts (an empty placeholder; a committed
# one is hidden by it too); this is the one it writes on "none", so `localhost` resolves as before.
# Where commands run as root, each shell server writes it before it starts (no extra Docker call);
# elsewhere it is copied in before the container starts.
_HOSTS = (b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
          b"ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")
_OFFLINE_ETC = {"etc/hosts": _HOSTS}
_HOSTS_SETUP = "[ -s /etc/hosts ] || printf '%s' '" + _HOSTS.decode() + "' > /etc/hosts"
_ROOT_USERS = ("", "root", "0", "root:root", "0:0")
# put_dir writes a small tree of regular files through the shell server when commands run as root:
# no archive copy, each of which is a dockerd helper process of its own (~0.1 s of CPU on 2 cores)
INLINE_PUT_MAX_BYTES = 48 * 1024
DISK_POLL_S = 1.0  # how often a running command's writable layer is measured (storage_mb)
_engine_cpus: dict[str | None, int] = {}  # per engine endpoint
_live: set["DockerSandbox"] = set()
_unremoved: dict[str, str | None] = {}  # closed sandboxes whose container could not be removed (engine down)
_live_lock = threading.Lock()


def _cpu_count(client: docker.DockerClient, endpoint: str | None) -> int:
    if endpoint not in _engine_cpus:
        _engine_cpus[endpoint] = int(client.info().get("NCPU") or os.cpu_count() or 1)
    return _engine_cpus[endpoint]


def _internet_network(client: docker.DockerClient) -> str:
    found = client.networks.list(names=[INTERNET_NETWORK])
    if not found:
        try:
            client.networks.create(INTERNET_NETWORK, driver="bridge",
                                   labels=labels.labels(labels.KIND_NETWORK))
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: another thread created it first
                raise SandboxError(f"cannot create network {INTERNET_NETWORK} for a task with "
                                   f"allow_internet=true: {e}") from e
    return INTERNET_NETWORK


def _bash_bytes(data: bytes) -> str:
    """`data` as a single-quoted argument of `printf '%b'`: printable ASCII as is, any other byte
    (quote, backslash, newline, NUL, UTF-8...) as an octal escape."""
    return "".join(chr(b) if 32 <= b < 127 and b not in (39, 92) else f"\\0{b:03o}" for b in data)


def inline_put_script(local_dir: Path, dest: str) -> str | None:
    """One bash command that replaces `dest` with a copy of `local_dir` (modes kept), or None when
    the tree holds anything but directories and regular files, or is over INLINE_PUT_MAX_BYTES.
    Its steps are chained with `&&` (no `set -e`), so it can also run inside a shell server's
    prelude without changing that shell's options."""
    lines, size = [f"rm -rf {shlex.quote(dest)}", f"mkdir -p {shlex.quote(dest)}",
                   f"chmod {stat.S_IMODE(local_dir.stat().st_mode):o} {shlex.quote(dest)}"], 0
    for root, dirs, files in os.walk(local_dir):
        dirs.sort()
        for name in dirs + sorted(files):
            src = Path(root) / name
            target = shlex.quote(f"{dest}/{src.relative_to(local_dir).as_posix()}")
            mode = src.lstat().st_mode
            if stat.S_ISDIR(mode) and not src.is_symlink():
                lines.append(f"mkdir -p {target}")
            elif stat.S_ISREG(mode):
                size += src.stat().st_size
                if size > INLINE_PUT_MAX_BYTES:
                    return None
                lines.append(f"printf '%b' '{_bash_bytes(src.read_bytes())}' > {target}")
            else:
                return None
            lines.append(f"chmod {stat.S_IMODE(mode):o} {target}")
    return " &&\n".join(lines)


class DockerSandbox:
    """A running container plus the harness contract. Thread-safe: commands on one
    sandbox run one at a time (they share the cwd/env state)."""

    output_head_bytes = 10_000        # observation = first 10 kB + last 10 kB
    max_output_file_bytes = 1 << 30   # a command whose output passes 1 GiB is killed

    def __init__(self, image: str, *, limits: Limits = Limits(), task: Task | None = None,
                 snapshot=None):
        # snapshot: what must outlive this sandbox (a Snapshot, or a failure-bank pin); told
        # through _add_user(self) once started and _remove_user(self) on close.
        from reterm_jax.sandbox.reaper import reap_once
        reap_once()
        # A sandbox lives on one engine and talks only to it: a branch on its snapshot's (the
        # image exists there only), otherwise the caller's (a SandboxPool job's endpoint).
        self.endpoint = snapshot.endpoint if hasattr(snapshot, "endpoint") else current_endpoint()
        client = get_client(self.endpoint)
        self.image, self.limits, self.task, self.source_snapshot = image, limits, task, snapshot
        self._lock = threading.Lock()
        self._closed = False
        self._consumed: str | None = None  # why no agent command or snapshot may follow (consume)
        self._session: ShellSession | None = None
        self.name = f"reterm-{labels.run_id()}-{uuid.uuid4().hex[:10]}"
        extra = {labels.TASK: task.name} if task else {}
        kwargs = dict(
            entrypoint=["sleep"], command=["infinity"], name=self.name, detach=True,
            init=True,  # reaps the zombies of background jobs the agent leaves behind
            hostname="sandbox", labels=labels.labels(labels.KIND_CONTAINER, **extra),
            network_mode=_internet_network(client) if limits.allow_internet else "none",
            network_disabled=not limits.allow_internet,  # no network setup at all (_OFFLINE_ETC)
            cap_drop=["ALL"], cap_add=CAPS, security_opt=["no-new-privileges"],
            privileged=False, pids_limit=limits.pids,
            mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m",
            nano_cpus=int(min(limits.cpus, _cpu_count(client, self.endpoint)) * 1e9))
        if limits.runtime:
            kwargs["runtime"] = limits.runtime
        try:
            self._container = retry(lambda: self._create(client, kwargs), what="create")
            self.runs_as_root = str(self._container.attrs["Config"].get("User") or "") in _ROOT_USERS
            offline = not limits.allow_internet
            self._session_setup = _HOSTS_SETUP if offline and self.runs_as_root else ""
            files = dict(_OFFLINE_ETC) if offline and not self.runs_as_root else {}
            if limits.runtime == "runsc":
                # gVisor mounts its own in-sandbox tmpfs over an EMPTY /tmp, which `docker commit`
                # never sees: snapshots and branches would lose /tmp (and the harness's saved cwd
                # and environment there). A file in /tmp before the start keeps /tmp on the rootfs.
                files.update(_KEEP_TMP)
            if files:
                archive = _tar_of(files)
                retry(lambda: client.api.put_archive(self.name, "/", archive), what="write /etc/hosts")
            retry(self._container.start, what="start")
            self.workdir = self._container.attrs["Config"].get("WorkingDir") or "/"
        except docker.errors.ImageNotFound as e:
            self._remove_quietly()
            raise SandboxError(f"image {image!r} not found; build the task image first "
                               "(ensure_task_image / DockerSandbox.from_task)") from e
        except (docker.errors.APIError, requests.RequestException) as e:
            self._remove_quietly()
            raise SandboxError(f"could not start a sandbox from {image!r}: {e}") from e
        with _live_lock:
            _live.add(self)
        if snapshot is not None:
            snapshot._add_user(self)

    def _create(self, client: docker.DockerClient, kwargs: dict):
        try:
            return client.containers.create(self.image, **kwargs)
        except docker.errors.APIError as e:
            if e.status_code == 409:  # an earlier, retried create did succeed
                return client.containers.get(self.name)
            raise

    @classmethod
    def from_task(cls, task: Task, *, limits: Limits | None = None) -> "DockerSandbox":
        from reterm_jax.sandbox.images import ensure_task_image
        return cls(ensure_task_image(task), limits=limits or Limits.from_task(task), task=task)

    @property
    def id(self) -> str:
        return self._container.id

    def exec(self, command: str, timeout: float = 180.0, *, persist: bool = True) -> ExecResult:
        """Run one bash command. persist=False runs it from the image's working dir and
        environment without reading or writing the agent's cwd/env state (verifier use)."""
        if len(command.encode()) > 120_000:  # one argv string is capped at 128 KiB by Linux
            return ExecResult("", -1, error=f"command is {len(command.encode())} bytes; the "
                              "limit is 120000 (write large files in several commands)")
        if persist and self._consumed:
            return ExecResult("", -1, error=f"sandbox {self.name} takes no more agent commands: {self._consumed}")
        timeout_s = max(1, math.ceil(timeout))
        start = time.monotonic()
        # storage_mb: the agent's commands (persist=True) run under the disk watchdog
        watchdog = _DiskWatchdog(self) if self.limits.storage_mb and persist and not self._closed else None
        try:
            res = self._exec(command, timeout_s, persist, start)
        finally:
            if watchdog is not None:
                watchdog.finish()
        if watchdog is not None and watchdog.exceeded is not None:
            return self._disk_limit_result(watchdog.exceeded, time.monotonic() - start)
        return res

    def _exec(self, command: str, timeout_s: int, persist: bool, start: float) -> ExecResult:
        with self._lock:
            if self._closed:
                return ExecResult("", -1, error="sandbox is closed")
            try:
                if self._session is not None and self._session.ended():
                    self._session.close()  # the command was not sent: start a new server
                    self._session = None
                if self._session is None:
                    self._session = ShellSession(get_client(self.endpoint).api, self.id,
                                                 shell.OUTER, shell.INNER, setup=self._session_setup)
                reply = self._session.request(
                    command, persist=persist, timeout_s=timeout_s,
                    head_bytes=self.output_head_bytes, max_file_bytes=self.max_output_file_bytes,
                    read_timeout_s=timeout_s + 60)  # timeout + kill grace + slack
            except SessionBroken as e:
                self._session.close()
                self._session = None
                state = self._container_state(wait_s=1)
                if e.stalled:  # the old server may still run the command; it is abandoned
                    return ExecResult("", -1, duration_s=time.monotonic() - start,
                                      error=f"sandbox {self.name}: {e}; shell restarted")
                if state is not None and state.get("Running"):
                    # The command killed the shell server (e.g. `pkill bash`); the sandbox
                    # is fine and the next command starts a new server.
                    return ExecResult("[the command ended the sandbox's shell]\n", 137,
                                      duration_s=time.monotonic() - start)
                return ExecResult("", -1, duration_s=time.monotonic() - start,
                                  error=self._explain_failure(e, state))
            except (docker.errors.APIError, requests.RequestException) as e:
                return ExecResult("", -1, duration_s=time.monotonic() - start,
                                  error=self._explain_failure(e))
        duration = time.monotonic() - start
        res = shell.parse_reply(reply, head_bytes=self.output_head_bytes,
                                max_file_bytes=self.max_output_file_bytes, duration_s=duration)
        if res is None:  # e.g. no pid left to fork the reply's `wc` (fork bomb)
            return ExecResult(reply.decode(errors="replace")[-2000:], -1, duration_s=duration,
                              error=f"sandbox {self.name}: malformed command reply")
        return res

    def writable_bytes(self) -> int | None:
        """The container's writable-layer size (the engine's SizeRw), None when it cannot be read."""
        try:
            api = get_client(self.endpoint).api  # docker-py's inspect_container has no size argument
            info = api._result(api._get(api._url("/containers/{0}/json", self.name), params={"size": 1}), True)
            return int(info.get("SizeRw") or 0)
        except Exception:  # noqa: BLE001 - the engine or the container is gone
            return None

    def _disk_limit_result(self, size: int, duration: float) -> ExecResult:
        return ExecResult("", -1, duration_s=duration, disk_limit=True,
                          error=f"disk_limit: sandbox {self.name} wrote {size / 2**20:.0f} MiB to its writable "
                                f"layer, over the task's storage_mb={self.limits.storage_mb}; it was stopped")

    def _container_state(self, wait_s: float = 0.0) -> dict | None:
        """The container's State; waits up to wait_s for a dying one to stop (a killed
        container ends its streams a moment before its state says so)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._container.reload()
                state = self._container.attrs["State"]
            except Exception:  # noqa: BLE001 - the engine itself may be gone
                return None
            if not state.get("Running") or time.monotonic() >= deadline:
                return state
            time.sleep(0.2)

    def _explain_failure(self, cause, state: dict | None = None) -> str:
        state = state or self._container_state(wait_s=3)
        if state is None:
            return f"sandbox {self.name}: Docker error ({cause}); container state unknown"
        if not state.get("Running"):
            return (f"sandbox {self.name} died: container status {state.get('Status')}, "
                    f"exit code {state.get('ExitCode')}, OOMKilled={state.get('OOMKilled')} "
                    f"(cause: {cause})")
        return f"sandbox {self.name}: Docker error while the container runs: {cause}"

    def alive(self) -> bool:
        try:
            self._container.reload()
            return bool(self._container.attrs["State"].get("Running"))
        except Exception:  # noqa: BLE001
            return False

    def put_dir(self, local_dir: str | os.PathLike, dest: str, *, replace: bool = True) -> None:
        """Copy a host directory to `dest` in the container (replacing it), owned by root.
        replace=False: the caller made sure `dest` does not exist and its parent does.
        A small tree of regular files (INLINE_PUT_MAX_BYTES) in a sandbox whose commands run as root
        is written by one command of its shell server; anything else is copied as an archive."""
        local_dir, dest = Path(local_dir), dest.rstrip("/")
        script = inline_put_script(local_dir, dest) if self.runs_as_root else None
        if script is not None:
            r = self.exec(script, timeout=60, persist=False)
            if not r.ok or r.exit_code != 0:
                raise SandboxError(f"cannot copy {local_dir} to {dest} in {self.name}: {r.error or r.output}")
            return
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                return info
            tar.add(local_dir, arcname=os.path.basename(dest), filter=as_root)
        parent = os.path.dirname(dest) or "/"
        if replace:
            prep = self.exec(f"rm -rf {shlex.quote(dest)} && mkdir -p {shlex.quote(parent)}",
                             timeout=60, persist=False)
            if not prep.ok or prep.exit_code != 0:
                raise SandboxError(f"cannot prepare {dest} in {self.name}: {prep.error or prep.output}")
        try:
            retry(lambda: get_client(self.endpoint).api.put_archive(self.id, parent, buf.getvalue()),
                  what="put_archive")
        except (docker.errors.APIError, requests.RequestException) as e:
            raise SandboxError(f"cannot copy {local_dir} to {dest} in {self.name}: {e}") from e

    def snapshot(self):
        """Commit the filesystem (with the cwd/env state file) to a managed image."""
        from reterm_jax.sandbox.snapshots import take_snapshot
        if self._consumed:
            raise SandboxError(f"sandbox {self.name} cannot be snapshotted: {self._consumed}")
        return take_snapshot(self)

    def consume(self, reason: str, *, prelude: str = "") -> int | None:
        """The agent's attempt here is over for good (e.g. verified in place: in_place.py): its
        shell server ends, and agent commands (persist=True) and snapshots are refused with `reason`.
        Verifier commands (persist=False) still run, on a new server. With `prelude` (bash run in
        the new server's process before it serves) the new server starts now, and if the prelude
        fails nothing is consumed: returns its exit status (None: consumed). SandboxError when the
        connection broke before the prelude reported, with no failing status to return."""
        with self._lock:
            if self._closed:
                raise SandboxError(f"sandbox {self.name} is closed")
            if self._session is not None:
                self._session.close()
                self._session = None
            if prelude:
                try:
                    self._session = ShellSession(get_client(self.endpoint).api, self.id, shell.OUTER, shell.INNER,
                                                 prelude=prelude, setup=self._session_setup)
                except PreludeFailed as e:
                    if not e.exit_code:  # 0 or unknown: the prelude did not fail, its stream broke
                        raise SandboxError(f"sandbox {self.name}: the connection to its new shell server broke "
                                           f"before the prelude reported (exec status {e.exit_code}; {e.cause}); "
                                           "was the container stopped or removed?") from e
                    return e.exit_code
                except (docker.errors.APIError, requests.RequestException) as e:
                    raise SandboxError(f"sandbox {self.name}: could not start a shell server: {e}") from e
            self._consumed = reason
        return None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._session is not None:
                self._session.close()
        self._remove_quietly()
        with _live_lock:
            _live.discard(self)
        if self.source_snapshot is not None:
            self.source_snapshot._remove_user(self)

    def _remove_quietly(self) -> None:
        try:
            retry(lambda: get_client(self.endpoint).api.remove_container(self.name, force=True), what="remove")
        except docker.errors.NotFound:
            pass
        except Exception:  # noqa: BLE001 - e.g. the engine is down: removed later by remove_leftovers()
            with _live_lock:
                _unremoved[self.name] = self.endpoint

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DockerSandbox({self.name}, image={self.image[:24]})"


class _DiskWatchdog:
    """While one command runs: polls the sandbox's writable-layer size every DISK_POLL_S and, past
    limits.storage_mb, kills the container (the command's exec then ends) and records the size. A
    last check runs when the command returns, so a write between polls is caught too. The engine's
    size walk costs a few ms for a small layer; it only runs while a command runs."""

    def __init__(self, sandbox: "DockerSandbox"):
        self.sandbox, self.exceeded = sandbox, None
        self.limit = sandbox.limits.storage_mb * 2**20
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"disk-{sandbox.name}", daemon=True)
        self._thread.start()

    def _check(self) -> bool:
        size = self.sandbox.writable_bytes()
        if size is not None and size > self.limit and self.exceeded is None:
            self.exceeded = size
            try:
                get_client(self.sandbox.endpoint).api.kill(self.sandbox.name)
            except Exception:  # noqa: BLE001 - already dead: the result says disk_limit anyway
                pass
            return True
        return False

    def _run(self) -> None:
        while not self._done.wait(DISK_POLL_S):
            if self._check():
                return

    def finish(self) -> None:
        self._done.set()
        self._thread.join()
        if self.exceeded is None:
            self._check()


def remove_leftovers() -> int:
    """Remove the containers of closed sandboxes whose removal failed (the engine was down or
    restarting then), whatever state the engine left them in. Returns how many are still left
    (their engine still does not answer; the reaper removes them at the next start)."""
    with _live_lock:
        pending = dict(_unremoved)
    for name, endpoint in pending.items():
        try:
            retry(lambda: get_client(endpoint).api.remove_container(name, force=True), what="remove")
        except docker.errors.NotFound:
            pass
        except Exception:  # noqa: BLE001 - still unreachable
            continue
        with _live_lock:
            _unremoved.pop(name, None)
    with _live_lock:
        return len(_unremoved)


@atexit.register
def _close_live_sandboxes() -> None:
    with _live_lock:
        live = list(_live)
    for sb in live:
        sb.close()
    remove_leftovers()
