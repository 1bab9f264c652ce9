"""Orbax CheckpointManager for the whole train state (async, keep-N).

Layout under the checkpoint dir (one subdir per saved step, orbax's):

    <dir>/<step>/params      nnx pure dict of the model Params (what reterm_jax.convert reads)
    <dir>/<step>/opt_state   optax state
    <dir>/<step>/train       JSON: step, RNG key, the Grain data-iterator state, and the run's
                             extra fields (GRPO: policy_version, the failure bank's cursor);
                             multi-process: also "data_iterators" / "process_extras", one
                             entry per process (each reads its own shard / runs its own bank)
    <dir>/config.json        the model's HF config (so `convert --to=hf --checkpoint=<dir>` works)

The data-iterator state is Grain's own `get_state()` dict, stored as JSON (what
grain.checkpoint does) but taken synchronously at `save()`: with async saving the loop
keeps pulling batches while the arrays are written, so the iterator must be captured at
the step it belongs to. Orbax copies the arrays to host before `save()` returns, so the
train step may donate (overwrite) the device buffers right after.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from reterm_jax.train.state import TrainState


class Checkpointer:
    def __init__(self, directory: str, *, max_to_keep: int, save_every: int, async_save: bool = True):
        if save_every < 1 or max_to_keep < 1:
            raise ValueError(f"checkpoint.every={save_every} and checkpoint.keep={max_to_keep} must be >= 1")
        self.directory = os.path.abspath(directory)
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: TrainState, data_state: dict, *, force: bool = False,
             extra: dict | None = None, process_extra: dict | None = None) -> bool:
        """Save when `step` is on the save interval (or `force`); returns whether it saved.
        extra: more JSON fields for the `train` item (taken now, like the iterator state), the
        same on every process. process_extra: JSON fields that differ per process (GRPO: the
        failure bank's cursor); one process: stored like `extra`; several: gathered, like the
        iterator states, into a "process_extras" list by process index (a collective), and
        `restore(with_extra=True)` hands each process its own entry's fields."""
        # Our own interval test: orbax's should_save() also fires on the first step of a run.
        if not (force or step % self.save_every == 0):
            return False
        train = {"step": int(step), "rng": np.asarray(jax.device_get(state.rng)).tolist(),
                 "data_iterator": data_state}
        if jax.process_count() > 1:
            # Each process reads its own shard and so has its own iterator position, but this
            # JSON item is written by process 0 alone: it holds all of them, by process index.
            train["data_iterators"] = _from_every_process(data_state)
        clash = sorted(set(extra or {}) & set(train))
        if clash:
            raise ValueError(f"checkpoint extra fields {clash} would overwrite the train item's own")
        train.update(extra or {})
        if process_extra is not None:
            clash = sorted(set(process_extra) & (set(train) | {"process_extras"}))
            if clash:
                raise ValueError(f"checkpoint process_extra fields {clash} would overwrite other fields")
            if jax.process_count() > 1:
                train["process_extras"] = _from_every_process(process_extra)
            else:
                train.update(process_extra)
        return self.manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt_state=ocp.args.StandardSave(state.opt_state),
            train=ocp.args.JsonSave(train)), force=True)

    def restore(self, step: int, target: TrainState, *, with_extra: bool = False):
        """(state, data-iterator state) saved at `step`; `target` holds ShapeDtypeStructs with
        shardings (state.abstract_train_state), so every array lands on its device slice.
        with_extra: (state, data-iterator state, the extra JSON fields given to save)."""
        out = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(target.params),
            opt_state=ocp.args.StandardRestore(target.opt_state),
            train=ocp.args.JsonRestore()))
        train = out["train"]
        if train["step"] != step:
            raise ValueError(f"{self.directory}/{step}: records step {train['step']}; the checkpoint is corrupt")
        train["data_iterator"] = _this_process(train, f"{self.directory}/{step}")
        put = lambda x, like: jax.device_put(np.asarray(x, dtype=like.dtype), like.sharding)
        state = TrainState(step=put(step, target.step), params=out["params"],
                           opt_state=out["opt_state"], rng=put(train["rng"], target.rng))
        if with_extra:
            extra = {k: v for k, v in train.items()
                     if k not in ("step", "rng", "data_iterator", "data_iterators", "process_extras")}
            if "process_extras" in train:
                extra.update(_this_process({"data_iterators": train["process_extras"]}, f"{self.directory}/{step}"))
            return state, train["data_iterator"], extra
        return state, train["data_iterator"]

    def restore_latest(self, target: TrainState, *, with_extra: bool = False):
        """(step, restore(step, ...)) for the newest step that restores, or None when there is no
        checkpoint. A step that fails while an older one restores is damaged (the same target reads
        the older one, so it is not a config change): it is named in a warning and moved aside to
        <dir>.unreadable/<step>-<time>, and the run resumes from the older step. When no step
        restores, nothing is moved and a one-line error says what to delete (or that the config
        no longer matches the checkpoint)."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            return None
        failed = []
        for step in steps:
            try:
                restored = self.restore(step, target, with_extra=with_extra)
            except Exception as e:  # noqa: BLE001 - orbax / tensorstore raise many types for bad files
                reason = _first_line(e)
                logging.warning("checkpoint %s/%d cannot be restored: %s", self.directory, step, reason)
                failed.append((step, reason))
                continue
            for bad, reason in failed:
                self._set_aside(bad, reason)
            if failed:
                logging.warning("resuming from the newest readable checkpoint, step %d (set aside: %s)", step,
                                ", ".join(str(b) for b, _ in failed))
            return step, restored
        from reterm_jax.errors import UserError
        raise UserError(f"no checkpoint in {self.directory} can be restored (steps {steps}; step {steps[0]}: "
                        f"{failed[0][1]}). If the config changed since they were written, use a new --workdir; "
                        f"if the files are damaged, delete {self.directory} to start afresh")

    def _set_aside(self, step: int, reason: str) -> None:
        if jax.process_index() == 0:
            aside = f"{self.directory}.unreadable"
            os.makedirs(aside, exist_ok=True)
            dest = os.path.join(aside, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.move(os.path.join(self.directory, str(step)), dest)
            with open(os.path.join(dest, "WHY.txt"), "w") as fh:
                fh.write(reason + "\n")
            logging.warning("moved the unreadable checkpoint step %d to %s", step, dest)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"set aside checkpoint {step}")
        self.manager.reload()

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    return f"{type(error).__name__}: {text[:300]}"


def _from_every_process(obj) -> list:
    """[obj of process 0, obj of process 1, ...] on every process (JSON-able objs; a collective)."""
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    size = int(np.max(multihost_utils.process_allgather(np.array([data.size], np.int32))))
    padded = np.zeros(size, np.uint8)
    padded[:data.size] = data
    rows = multihost_utils.process_allgather(padded)  # [processes, size]
    return [json.loads(bytes(row).rstrip(b"\0")) for row in np.asarray(rows)]


def _this_process(train: dict, where: str):
    """This process's data-iterator state from a saved `train` item."""
    states = train.get("data_iterators") or [train["data_iterator"]]
    if len(states) != jax.process_count():
        raise ValueError(f"{where} was written by {len(states)} process(es) and this job has {jax.process_count()}: "
                         "each process's data position belongs to its own shard of the rows, so resume with "
                         f"{len(states)} process(es)")
    return states[jax.process_index()]


# The orbax item that holds a checkpoint's params (a CheckpointManager step's, or `convert --to=orbax`'s).
PARAMS_ITEM = "params"


def find_params_dir(checkpoint: str) -> str:
    """`checkpoint` itself, its `params/`, or `<latest step>/params` of a CheckpointManager dir."""
    if not os.path.isdir(checkpoint):
        raise FileNotFoundError(f"--checkpoint {checkpoint!r} does not exist or is not a directory")
    if os.path.exists(os.path.join(checkpoint, "_CHECKPOINT_METADATA")) and \
            not os.path.isdir(os.path.join(checkpoint, PARAMS_ITEM)):
        return checkpoint
    if os.path.isdir(os.path.join(checkpoint, PARAMS_ITEM)):
        return os.path.join(checkpoint, PARAMS_ITEM)
    steps = sorted((int(d) for d in os.listdir(checkpoint) if d.isdigit()), reverse=True)
    for step in steps:
        cand = os.path.join(checkpoint, str(step), PARAMS_ITEM)
        if os.path.isdir(cand):
            return cand
    raise FileNotFoundError(f"{checkpoint}: no orbax params found (looked for params/ and "
                            "<step>/params/); pass a dir written by --to=orbax or a training run")
