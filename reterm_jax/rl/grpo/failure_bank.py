"""The failure bank: the agent's own failed attempts, kept as branchable environment states.

    bank = FailureBank("runs/x/failures")
    entry = bank.add(sb, task, trajectory, policy_version=3, reward=0.0, end_reason="stop")
    e = bank.next()                       # deterministic order from (seed, cursor)
    sandboxes = bank.branch(e, 8)         # 8 independent copies of the failure state
    ...; [sb.close() for sb in sandboxes] # e stays pinned (never pruned) until these close

Each entry is a Docker image committed from the failed sandbox BEFORE verification (verify()
runs on a clone, so the agent's sandbox never holds the verifier's side effects), plus the
trajectory's exact tokens and messages, the task directory and metadata.

On disk (`directory/`):
    bank.json               the index (entry metadata, image ids) and the next() cursor;
                            rewritten atomically (tmp file + os.replace) after every change
    entries/<id>.json       tokens + messages of one entry (written once; loaded on demand, so
                            a bank of long trajectories does not live in host memory)
    .lock                   flock held by the open FailureBank: one writer per directory

Images are owned by the bank, not by a process: tagged `reterm-bank/<bank id>:<entry id>` and
labelled kind "bank" + the bank id, which the reaper never removes (labels.KIND_BANK). A new
FailureBank on the same directory sees the same entries; entries whose image or payload file
disappeared are dropped with a warning, and bank images that no entry references (a crash
between commit and index write, an untagged parent of a later entry) are removed.

Pruning (after every add, and prune()): oldest first, entries older than max_age_s, then
beyond max_entries, then beyond max_bytes (each entry's own layer size as Docker reports it:
image size minus the size of the image the sandbox ran). Entries pinned by running branches
are never pruned. Thread-safe: workers may call add/next/branch/prune from threads.
"""
from __future__ import annotations

import dataclasses
import datetime
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import docker
import numpy as np

from reterm_jax.errors import UserError
from reterm_jax.sandbox import labels
from reterm_jax.sandbox.client import SandboxError, get_client, retry
from reterm_jax.sandbox.sandbox import DockerSandbox, Limits
from reterm_jax.sandbox.snapshots import commit_image, start_sandboxes
from reterm_jax.sandbox.task import Task, load_task

log = logging.getLogger(__name__)
FORMAT = "reterm_jax.failure_bank"
VERSION = 1
IMAGE_REPO = "reterm-bank"


class FailureBankError(UserError):
    """A bank directory that cannot be used; the message names the file and the fix (a UserError:
    the command lines print it as one line)."""


def check_not_in_use(directory, workdir: str) -> None:
    """Raise FailureBankError, naming `workdir`, when a FailureBank (another trainer on the same
    workdir) holds `directory`'s lock. Cheap, creates nothing: a trainer calls it before it loads
    a model, so a second run on a workdir in use stops with one line instead of after minutes."""
    lock = Path(directory) / ".lock"
    if not lock.is_file():
        return
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise FailureBankError(
                f"--workdir={workdir}: its failure bank {directory} is in use by another trainer (a process holds "
                f"{lock}); stop that run first, or give this one another --workdir") from None
        fcntl.flock(f, fcntl.LOCK_UN)


@dataclasses.dataclass
class FailureEntry:
    entry_id: str
    task_dir: str              # absolute path of the Harbor task directory
    task_name: str
    image: str                 # the bank-owned snapshot image (repo:tag), state BEFORE verification
    tokens: list[int]          # the failed trajectory's exact tokens
    messages: list[dict]       # the failed trajectory's messages
    policy_version: int
    reward: float
    end_reason: str
    created: float             # unix time
    size_bytes: int = 0


_META_FIELDS = [f.name for f in dataclasses.fields(FailureEntry)
                if f.name not in ("tokens", "messages")]


def _atomic_write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _new_entry_id(created: float) -> str:
    # Sorts by creation time; a valid Docker tag ([A-Za-z0-9_.-], <= 128 chars).
    stamp = datetime.datetime.fromtimestamp(created, datetime.timezone.utc)
    return f"{stamp:%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:6]}"


def prune_victims(entries, *, held: set[str], now: float, max_age_s: float, max_entries: int,
                  max_bytes: int) -> list[str]:
    """The entry ids to remove (pure): every unheld entry older than max_age_s, then unheld
    entries oldest first while more than max_entries remain or their size_bytes sum passes
    max_bytes. Held (pinned) entries still count toward the limits but are never chosen."""
    entries = sorted(entries, key=lambda e: (e["created"], e["entry_id"]))
    victims = [e["entry_id"] for e in entries
               if e["entry_id"] not in held and now - e["created"] > max_age_s]
    left = [e for e in entries if e["entry_id"] not in victims]
    candidates = [e for e in left if e["entry_id"] not in held]  # oldest first
    while candidates and (len(left) > max_entries
                          or sum(e["size_bytes"] for e in left) > max_bytes):
        victim = candidates.pop(0)
        victims.append(victim["entry_id"])
        left.remove(victim)
    return victims


class _Pin:
    """Registered as a branch sandbox's `snapshot` owner: DockerSandbox calls _add_user when
    it starts and _remove_user when it closes, which (un)pins the entry."""

    def __init__(self, bank: "FailureBank", entry_id: str):
        self.bank, self.entry_id = bank, entry_id

    def _add_user(self, sandbox) -> None:
        self.bank._pin(self.entry_id, +1)

    def _remove_user(self, sandbox) -> None:
        self.bank._pin(self.entry_id, -1)


class FailureBank:
    def __init__(self, directory, *, max_entries: int = 256, max_age_s: float = 7 * 24 * 3600,
                 max_bytes: int = 50 * 2**30, seed: int = 0):
        self.directory = Path(directory).resolve()
        self.max_entries, self.max_age_s, self.max_bytes = max_entries, max_age_s, max_bytes
        self.seed = int(seed)
        self._lock = threading.RLock()
        self._index: dict[str, dict] = {}       # entry_id -> metadata (+ "image_id")
        self._pins: dict[str, int] = {}          # entry_id -> running branches (+ reservations)
        self._tasks: dict[str, Task] = {}
        self._leftover_images: set[str] = set()  # deletions Docker refused; retried on prune
        self._cursor = {"epoch": 0, "pos": 0, "order": []}
        # entry_id -> {"groups", "attempts", "passes", "all_pass_streak"}: what recovery groups from
        # the entry scored (record()); drives next()'s preference and retirement
        self._outcomes: dict[str, dict] = {}
        self.retired = 0
        self._closed = False
        if self.directory.exists() and not self.directory.is_dir():
            raise FailureBankError(f"failure bank {self.directory} is not a directory; "
                                   "pass a directory path (it is created if missing)")
        (self.directory / "entries").mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.directory / ".lock", "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            self._lock_file.close()
            raise FailureBankError(
                f"failure bank {self.directory} is in use: another trainer on this workdir (or another "
                "FailureBank) holds its .lock; stop that run (close() that bank) first, or give this run "
                "another --workdir (two writers would prune each other's images)") from e
        try:
            self._open()
        except BaseException:
            self._release_lock()
            raise

    # ---- opening, reconciling with Docker -----------------------------------------------------
    @property
    def index_path(self) -> Path:
        return self.directory / "bank.json"

    def _payload_path(self, entry_id: str) -> Path:
        return self.directory / "entries" / f"{entry_id}.json"

    def _open(self) -> None:
        path = self.index_path
        if not path.exists():
            self.bank_id = hashlib.sha256(str(self.directory).encode()).hexdigest()[:12]
            self._write_index()
            self._sweep_orphan_images()  # a bank.json deleted by hand leaves its images behind
            return
        fix = (f"fix the file, or remove the directory {self.directory} to start an empty bank "
               f"(its images are tagged {IMAGE_REPO}/<bank id>; a new bank on the same path "
               "removes them)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise ValueError(f"'format' is {data.get('format')!r}, expected {FORMAT!r}")
            if data.get("version") != VERSION:
                raise ValueError(f"'version' is {data.get('version')!r}, expected {VERSION}")
            self.bank_id = str(data["bank_id"])
            entries = list(data["entries"])
            for e in entries:
                missing = [k for k in _META_FIELDS + ["image_id"] if k not in e]
                if missing:
                    raise ValueError(f"entry {e.get('entry_id')!r} lacks {missing}")
            cursor = data.get("cursor") or self._cursor
            self._check_cursor(cursor)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise FailureBankError(f"{path} is not a valid failure bank index ({e}); {fix}") from e
        client = get_client()
        dropped = []
        for e in entries:
            why = None
            try:
                found = client.api.inspect_image(e["image"])["Id"]
                if found != e["image_id"]:
                    why = f"its tag {e['image']} now names another image"
            except docker.errors.ImageNotFound:
                why = f"its image {e['image']} is gone"
            if why is None and not self._payload_path(e["entry_id"]).is_file():
                why = f"its payload file {self._payload_path(e['entry_id'])} is gone"
            if why:
                log.warning("failure bank %s: dropping entry %s: %s", self.directory,
                            e["entry_id"], why)
                dropped.append(e["entry_id"])
                self._payload_path(e["entry_id"]).unlink(missing_ok=True)
            else:
                self._index[e["entry_id"]] = e
        self._cursor = {"epoch": int(cursor["epoch"]), "pos": int(cursor["pos"]),
                        "order": list(cursor["order"])}
        self._outcomes = {k: dict(v) for k, v in (data.get("outcomes") or {}).items() if k in self._index}
        for p in (self.directory / "entries").glob("*.json"):  # crash between payload and index
            if p.stem not in self._index:
                p.unlink(missing_ok=True)
        if dropped:
            self._write_index()
        self._sweep_orphan_images()

    def _sweep_orphan_images(self) -> None:
        """Remove this bank's images that no entry references."""
        with self._lock:
            keep = {e["image_id"] for e in self._index.values()}
        sel = labels.managed_filter(labels.KIND_BANK, **{labels.BANK: self.bank_id})
        # the low-level listing: no inspect per image that a concurrent removal could race
        images = [im for im in get_client().api.images(all=True, filters=sel) if im["Id"] not in keep]
        # Newest first: children go before the parents Docker keeps for them.
        for im in sorted(images, key=lambda im: im.get("Created", 0), reverse=True):
            self._remove_image(im["Id"])

    def _write_index(self) -> None:
        with self._lock:
            data = {"format": FORMAT, "version": VERSION, "bank_id": self.bank_id,
                    "seed": self.seed, "cursor": self._cursor,
                    "entries": sorted(self._index.values(), key=lambda e: e["created"]),
                    "outcomes": {k: v for k, v in self._outcomes.items() if k in self._index}}
            _atomic_write_json(self.index_path, data)

    # ---- adding -------------------------------------------------------------------------------
    def _commit(self, sandbox: DockerSandbox, task: Task) -> tuple[str, str]:
        """`docker commit` of the sandbox's current filesystem as this bank's image for a new
        entry id (bank labels: the reaper never removes it; a crash before the index names it
        leaves an orphan that the next FailureBank on this directory removes). -> (entry id,
        image id)."""
        entry_id = _new_entry_id(time.time())
        image_labels = labels.labels(labels.KIND_BANK, **{
            labels.BANK: self.bank_id, labels.BANK_ENTRY: entry_id, labels.TASK: task.name})
        image_id = commit_image(sandbox, image_labels, repository=f"{IMAGE_REPO}/{self.bank_id}",
                                tag=entry_id, what="commit")
        return entry_id, image_id

    def snapshot(self, sandbox: DockerSandbox, task: Task):
        """The sandbox's current state committed once, as a possible entry's image: verify on it
        (`verify(sb, task, snapshot=s)`), then `add(..., snapshot=s)` keeps that very image for
        the entry, or `s.release()` deletes it (the attempt passed). One commit per banked
        failure instead of two (the verifier's and the bank's)."""
        from reterm_jax.sandbox.snapshots import Snapshot
        self._check_open()
        entry_id, image_id = self._commit(sandbox, task)
        snap = Snapshot(image_id, sandbox)
        snap.bank_entry = (self.bank_id, entry_id)
        return snap

    def add(self, sandbox: DockerSandbox, task: Task, trajectory, *, policy_version: int,
            reward: float, end_reason: str, end_token: int | None = None,
            snapshot=None) -> FailureEntry:
        """Commit the sandbox's CURRENT (unverified) filesystem to a bank-owned image and record
        the trajectory (anything with .tokens and .messages); then prune. With `snapshot` (from
        `self.snapshot`, of this sandbox's current state) its image becomes the entry's, and
        nothing is committed.

        Tokens are kept exactly as given; with `end_token` (the <|im_end|> id) they are cut
        after its last occurrence, dropping a trailing generation prompt or a turn cut off by
        the length limit, so a recovery user turn can follow directly."""
        self._check_open()
        tokens = [int(t) for t in trajectory.tokens]
        if end_token is not None and end_token in tokens:
            tokens = tokens[:len(tokens) - tokens[::-1].index(end_token)]
        if snapshot is not None:
            bank_id, entry_id = getattr(snapshot, "bank_entry", (None, None))
            if bank_id != self.bank_id:
                raise ValueError(f"add(snapshot=...) takes a snapshot from this bank's snapshot(), "
                                 f"got {snapshot!r}")
            image_id = snapshot.image_id
        else:
            entry_id, image_id = self._commit(sandbox, task)
        created = time.time()
        repo = f"{IMAGE_REPO}/{self.bank_id}"
        try:  # from here on, a failure must not leave the committed image behind
            entry = FailureEntry(
                entry_id=entry_id, task_dir=str(Path(task.path).resolve()), task_name=task.name,
                image=f"{repo}:{entry_id}", tokens=tokens,
                messages=list(trajectory.messages), policy_version=int(policy_version),
                reward=float(reward), end_reason=str(end_reason), created=created,
                size_bytes=self._layer_size(image_id, sandbox.image))
            _atomic_write_json(self._payload_path(entry_id),
                               {"tokens": entry.tokens, "messages": entry.messages})
            meta = {k: getattr(entry, k) for k in _META_FIELDS}
            meta["image_id"] = image_id
            with self._lock:
                self._check_open()
                self._index[entry_id] = meta
                self._write_index()
            if snapshot is not None:
                snapshot.keep()  # the bank owns the image now
        except BaseException:
            with self._lock:
                self._index.pop(entry_id, None)
            self._payload_path(entry_id).unlink(missing_ok=True)
            if snapshot is not None:
                snapshot.release()  # deleted once the clones that use it are gone
            else:
                self._remove_image(image_id)
            raise
        self._prune(protect={entry_id})
        return entry

    @staticmethod
    def _layer_size(image_id: str, parent: str) -> int:
        """Bytes this entry adds: its image size minus the size of the image the sandbox ran
        (Docker's Size counts the whole chain; the task image is shared by every entry)."""
        api = get_client().api
        size = int(api.inspect_image(image_id).get("Size") or 0)
        try:
            return max(0, size - int(api.inspect_image(parent).get("Size") or 0))
        except docker.errors.ImageNotFound:
            return size

    # ---- reading ------------------------------------------------------------------------------
    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def entry_ids(self) -> list[str]:
        """Current entries, oldest first."""
        with self._lock:
            return sorted(self._index, key=lambda i: (self._index[i]["created"], i))

    def get(self, entry_id: str) -> FailureEntry:
        """The full entry (tokens and messages read from its payload file). KeyError if pruned."""
        with self._lock:
            meta = dict(self._index[entry_id])
            payload = json.loads(self._payload_path(entry_id).read_text(encoding="utf-8"))
        meta.pop("image_id")
        return FailureEntry(tokens=payload["tokens"], messages=payload["messages"], **meta)

    def next(self) -> FailureEntry | None:
        """The next entry in a deterministic order: each epoch is a permutation of the entries
        present when it starts (sorted ids shuffled by (seed, epoch)); entries added during an
        epoch come in the next one, pruned ones are skipped. None when the bank is empty."""
        self._check_open()
        with self._lock:
            cur = self._cursor
            for _ in range(2):
                while cur["pos"] < len(cur["order"]):
                    entry_id = cur["order"][cur["pos"]]
                    cur["pos"] += 1
                    if entry_id in self._index:
                        self._write_index()
                        return self.get(entry_id)
                if not self._index:
                    return None
                rng = np.random.default_rng([self.seed, cur["epoch"]])
                ids = sorted(self._index)
                # a stable sort of the shuffled ids: entries whose groups split (0 < pass rate < 1:
                # they carry signal) first, then untried ones, then those that always fail or pass
                cur["order"] = sorted((ids[i] for i in rng.permutation(len(ids))), key=self._priority)
                cur["epoch"] += 1
                cur["pos"] = 0
            raise AssertionError("unreachable: a fresh epoch holds only present entries")

    def _priority(self, entry_id: str) -> int:
        o = self._outcomes.get(entry_id)
        if not o or not o["attempts"]:
            return 1
        return 0 if 0 < o["passes"] < o["attempts"] else 2

    def outcomes(self, entry_id: str) -> dict:
        """What the recovery groups from `entry_id` scored so far (zeros when untried)."""
        with self._lock:
            return dict(self._outcomes.get(entry_id) or {"groups": 0, "attempts": 0, "passes": 0,
                                                         "all_pass_streak": 0})

    def record(self, entry_id: str, resolved: list[bool], *, retire_after: int = 0) -> bool:
        """A recovery group from `entry_id` ended with these (valid members') outcomes. With
        retire_after > 0, an entry whose last retire_after groups all passed is removed: the
        policy has learnt to recover from it, and it only costs sandboxes. True when retired."""
        self._check_open()
        with self._lock:
            if entry_id not in self._index or not resolved:
                return False
            o = self._outcomes.setdefault(entry_id, {"groups": 0, "attempts": 0, "passes": 0, "all_pass_streak": 0})
            o["groups"] += 1
            o["attempts"] += len(resolved)
            o["passes"] += int(sum(bool(r) for r in resolved))
            o["all_pass_streak"] = o["all_pass_streak"] + 1 if all(resolved) else 0
            self._write_index()
            if not (retire_after and o["all_pass_streak"] >= retire_after):
                return False
        return bool(self._remove_entries([entry_id], why=f"its last {retire_after} groups all passed"))

    def retire_older_than(self, policy_version: int) -> list[str]:
        """Remove the entries collected by a policy older than `policy_version` (never pinned ones):
        failure states of a policy that no longer exists. Returns the removed ids."""
        self._check_open()
        with self._lock:
            old = [i for i, e in self._index.items() if int(e["policy_version"]) < policy_version]
        return self._remove_entries(old, why=f"collected by a policy older than version {policy_version}")

    def _remove_entries(self, ids: list[str], *, why: str) -> list[str]:
        with self._lock:
            victims = [self._index[i] for i in ids if i in self._index and i not in self._pins]
            self._forget(victims)
            self.retired += len(victims)
        for e in victims:
            log.info("failure bank %s: retired entry %s (%s): %s", self.directory, e["entry_id"], e["task_name"], why)
            self._remove_image(e["image"], image_id=e["image_id"])
        return [e["entry_id"] for e in victims]

    def state(self) -> dict:
        """The next() cursor (JSON-serialisable), for exact resume with set_state."""
        with self._lock:
            return {"seed": self.seed, "epoch": self._cursor["epoch"],
                    "pos": self._cursor["pos"], "order": list(self._cursor["order"])}

    def set_state(self, state: dict) -> None:
        self._check_cursor(state)
        with self._lock:
            self.seed = int(state.get("seed", self.seed))
            self._cursor = {"epoch": int(state["epoch"]), "pos": int(state["pos"]),
                            "order": [str(i) for i in state["order"]]}
            self._write_index()

    @staticmethod
    def _check_cursor(cursor) -> None:
        if not isinstance(cursor, dict) or not all(k in cursor for k in ("epoch", "pos", "order")):
            raise ValueError(f"a failure bank cursor needs epoch, pos and order; got {cursor!r}")
        if not isinstance(cursor["order"], list):
            raise ValueError(f"cursor order must be a list of entry ids, got {cursor['order']!r}")

    # ---- branching and pinning ----------------------------------------------------------------
    def branch(self, entry: FailureEntry | str, n: int, *,
               max_parallel: int = 8) -> list[DockerSandbox]:
        """n independent sandboxes started from the entry's image with the task's limits (all
        or nothing). The entry is pinned, never pruned, until every one of them is closed."""
        self._check_open()
        entry_id = entry if isinstance(entry, str) else entry.entry_id
        with self._lock:
            if entry_id not in self._index:
                raise SandboxError(f"failure {entry_id} is no longer in the bank {self.directory} "
                                   "(pruned); take another with next()")
            meta = self._index[entry_id]
            self._pins[entry_id] = self._pins.get(entry_id, 0) + 1  # held while starting
        try:
            if n < 1:
                return []
            task = self._task(meta["task_dir"])
            limits, pin = Limits.from_task(task), _Pin(self, entry_id)
            return start_sandboxes(lambda: DockerSandbox(meta["image"], limits=limits, task=task, snapshot=pin), n,
                                   max_parallel=max_parallel)
        finally:
            self._pin(entry_id, -1)

    def _task(self, task_dir: str) -> Task:
        with self._lock:
            task = self._tasks.get(task_dir)
        if task is None:
            task = load_task(task_dir, require_solution=False)
            with self._lock:
                self._tasks[task_dir] = task
        return task

    def _pin(self, entry_id: str, delta: int) -> None:
        with self._lock:
            left = self._pins.get(entry_id, 0) + delta
            if left > 0:
                self._pins[entry_id] = left
            else:
                self._pins.pop(entry_id, None)

    def pinned(self) -> set[str]:
        """Entry ids that running branches (or a branch() in progress) hold."""
        with self._lock:
            return set(self._pins)

    # ---- pruning ------------------------------------------------------------------------------
    def prune(self, *, now: float | None = None) -> list[str]:
        """Apply the age/count/size policy, oldest first, never touching pinned entries.
        Returns the removed entry ids. `now` (unix time) defaults to the clock."""
        self._check_open()
        return self._prune(now=now)

    def _forget(self, victims: list[dict]) -> None:
        """Drop these entries from the index, their outcomes and payload files (under the lock;
        the caller removes their images)."""
        for e in victims:
            del self._index[e["entry_id"]]
            self._outcomes.pop(e["entry_id"], None)
        if victims:
            self._write_index()
        for e in victims:
            self._payload_path(e["entry_id"]).unlink(missing_ok=True)

    def _prune(self, *, now: float | None = None, protect: set[str] = frozenset()) -> list[str]:
        now = time.time() if now is None else now
        with self._lock:
            ids = prune_victims(self._index.values(), held=set(self._pins) | set(protect),
                                now=now, max_age_s=self.max_age_s,
                                max_entries=self.max_entries, max_bytes=self.max_bytes)
            victims = [self._index[i] for i in ids]
            self._forget(victims)
            retry_images, self._leftover_images = self._leftover_images, set()
        for e in victims:
            self._remove_image(e["image"], image_id=e["image_id"])
        for image_id in retry_images:
            self._remove_image(image_id)
        return [e["entry_id"] for e in victims]

    def _remove_image(self, ref: str, *, image_id: str | None = None) -> None:
        """Remove a bank image without pruning its untagged parents (those may be live
        snapshots of other code). An image Docker keeps (a child image or a container still
        needs it) is remembered and retried on the next prune."""
        api = get_client().api
        try:
            retry(lambda: api.remove_image(ref, noprune=True), what="remove bank image")
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as e:
            log.info("failure bank %s: image %s kept for now: %s", self.directory, ref, e)
        try:  # untagging an image with children leaves it in place, untagged
            api.inspect_image(image_id or ref)
        except docker.errors.ImageNotFound:
            return
        with self._lock:
            self._leftover_images.add(image_id or ref)

    # ---- lifetime -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the failure bank {self.directory} is closed")

    def close(self) -> None:
        """Write the index and release the directory. Images and files stay (reopen to
        continue); sandboxes branched earlier keep running until their owners close them."""
        with self._lock:
            if self._closed:
                return
            self._write_index()
            self._closed = True
        self._release_lock()

    def destroy(self) -> None:
        """Remove every image of this bank and its files (bank.json, entries/, the directory
        when empty). Close branched sandboxes first: Docker keeps images containers use."""
        self._check_open()
        with self._lock:
            entries = list(self._index.values())
            self._index.clear()
            self._write_index()
        for e in entries:
            self._remove_image(e["image"], image_id=e["image_id"])
        self._sweep_orphan_images()
        with self._lock:
            self._closed = True
        shutil.rmtree(self.directory / "entries", ignore_errors=True)
        self.index_path.unlink(missing_ok=True)
        self._release_lock()
        (self.directory / ".lock").unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:
            pass  # other files live there

    def _release_lock(self) -> None:
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        finally:
            self._lock_file.close()

    def __enter__(self) -> "FailureBank":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FailureBank({self.directory}, {len(self)} entries, id={self.bank_id})"
