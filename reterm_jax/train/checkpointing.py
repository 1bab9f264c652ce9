"""Orbax CheckpointManager for the whole train state (async, keep-N).

Layout under the checkpoint dir (one subdir per saved step, orbax's):

    <dir>/<step>/params      nnx pure dict of the model Params (what reterm_jax.convert reads)
    <dir>/<step>/opt_state   optax state
    <dir>/<step>/train       JSON: step, RNG key, the Grain data-iterator state
    <dir>/config.json        the model's HF config (so `convert --to=hf --checkpoint=<dir>` works)

The data-iterator state is Grain's own `get_state()` dict, stored as JSON (what
grain.checkpoint does) but taken synchronously at `save()`: with async saving the loop
keeps pulling batches while the arrays are written, so the iterator must be captured at
the step it belongs to. Orbax copies the arrays to host before `save()` returns, so the
train step may donate (overwrite) the device buffers right after.
"""
from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp

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

    def save(self, step: int, state: TrainState, data_state: dict, *, force: bool = False) -> bool:
        """Save when `step` is on the save interval (or `force`); returns whether it saved."""
        # Our own interval test: orbax's should_save() also fires on the first step of a run.
        if not (force or step % self.save_every == 0):
            return False
        train = {"step": int(step), "rng": np.asarray(jax.device_get(state.rng)).tolist(),
                 "data_iterator": data_state}
        return self.manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt_state=ocp.args.StandardSave(state.opt_state),
            train=ocp.args.JsonSave(train)), force=True)

    def restore(self, step: int, target: TrainState) -> tuple[TrainState, dict]:
        """(state, data-iterator state) saved at `step`; `target` holds ShapeDtypeStructs with
        shardings (state.abstract_train_state), so every array lands on its device slice."""
        out = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(target.params),
            opt_state=ocp.args.StandardRestore(target.opt_state),
            train=ocp.args.JsonRestore()))
        train = out["train"]
        if train["step"] != step:
            raise ValueError(f"{self.directory}/{step}: records step {train['step']}; the checkpoint is corrupt")
        put = lambda x, like: jax.device_put(np.asarray(x, dtype=like.dtype), like.sharding)
        state = TrainState(step=put(step, target.step), params=out["params"],
                           opt_state=out["opt_state"], rng=put(train["rng"], target.rng))
        return state, train["data_iterator"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
