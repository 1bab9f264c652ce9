"""Which parameters train (`optim.trainable`): all of them, or only the top of the decoder.

    ""        every parameter (the default)
    "top:N"   the last N decoder layers, the final norm and an untied LM head; the embedding (and
              with it a tied head) and every lower layer stay frozen

A frozen parameter gets no update and no optimizer state (optax.multi_transform with set_to_zero),
and the loss sees it through `stop_gradient` (`freeze`), so JAX does not differentiate the layers
below the lowest trainable one at all: a step costs the forward plus the backward of the top N
layers. Needs per-layer params (model.scan_layers=False): a stacked param holds every layer.
"""
from __future__ import annotations

import re

import jax
import optax

from reterm_jax.errors import UserError

_TOP = re.compile(r"top:(\d+)$")


def _keys(path) -> list:
    return [getattr(p, "key", getattr(p, "name", getattr(p, "idx", None))) for p in path]


def check_spec(spec: str) -> int | None:
    """N of "top:N" (None for ""); one UserError line for anything else (trainable_mask checks N
    against the model's layers)."""
    if not spec:
        return None
    match = _TOP.match(spec)
    if not match or int(match.group(1)) < 1:
        raise UserError(f"optim.trainable={spec!r}: use '' (every parameter) or 'top:N' with N >= 1 "
                        f"(the last N decoder layers, the final norm and an untied head)")
    return int(match.group(1))


def trainable_mask(params, spec: str):
    """A pytree of bools like `params`: True where the parameter trains under `spec`."""
    top = check_spec(spec)
    leaves = jax.tree_util.tree_leaves_with_path(params)
    if top is None:
        return jax.tree.map(lambda _: True, params)
    keys = [_keys(path) for path, _ in leaves]
    if any("blocks" in k for k in keys):
        raise UserError(f"optim.trainable={spec!r} needs per-layer params; set model.scan_layers=False")
    layers = [int(k[k.index("layers") + 1]) for k in keys if "layers" in k]
    first = max(layers) + 1 - top
    if first < 0:
        raise UserError(f"optim.trainable={spec!r}: the model has {max(layers) + 1} layers")

    def trains(path, _):
        k = _keys(path)
        if "layers" in k:
            return int(k[k.index("layers") + 1]) >= first
        return "embed_tokens" not in k  # the final norm and an untied lm_head train
    return jax.tree_util.tree_map_with_path(trains, params)


def freeze(params, mask):
    """`params` with the frozen leaves behind stop_gradient (no gradient, no backward through them)."""
    if mask is None:
        return params
    return jax.tree.map(lambda m, p: p if m else jax.lax.stop_gradient(p), mask, params)


def masked(tx: optax.GradientTransformation, spec: str, params) -> optax.GradientTransformation:
    """`tx` on the trainable params only; frozen ones get zero updates and keep no state (their
    places in the state are optax MaskedNodes). `params`: the param tree, concrete or abstract (the
    labels are fixed here, not computed at init, so optax.tree_utils.tree_map_params can map the
    state)."""
    if not spec:
        return tx
    if params is None:
        raise ValueError("optim.trainable needs the param tree: make_optimizer(optim, params)")
    labels = jax.tree.map(lambda m: "train" if m else "frozen", trainable_mask(params, spec))
    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def is_masked(x) -> bool:
    """A frozen param's place in the optimizer state (for tree_map_params' is_leaf)."""
    return isinstance(x, optax.MaskedNode)
