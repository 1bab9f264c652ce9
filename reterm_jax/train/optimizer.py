"""AdamW with linear warmup + cosine decay and global-norm clipping (optax).

Weight decay skips 1-D params (norm scales, A_log, dt_bias): decaying a norm gain or a decay
rate towards 0 changes what the layer computes rather than regularising it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from reterm_jax.model.stacked import per_layer_ndim
from reterm_jax.train.trainable import masked


def lr_schedule(cfg) -> optax.Schedule:
    """cfg: ConfigDict with lr, warmup_steps, decay_steps, end_lr_ratio (fraction of lr at the end)."""
    if cfg.lr <= 0:
        raise ValueError(f"optim.lr={cfg.lr}: the learning rate must be positive")
    if cfg.decay_steps <= cfg.warmup_steps:
        raise ValueError(f"optim.decay_steps={cfg.decay_steps} must exceed optim.warmup_steps="
                         f"{cfg.warmup_steps} (decay_steps counts the warmup too)")
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.decay_steps, end_value=cfg.lr * cfg.end_lr_ratio)


def _decay_mask(params):
    """Weight decay on matrices only (not norms, biases, A_log, dt_bias), judged by the rank a
    param has per layer: a stacked layer param (scan_layers) has one more axis."""
    return jax.tree_util.tree_map_with_path(lambda path, p: per_layer_ndim(path, p) >= 2, params)


def make_optimizer(cfg, params=None) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """cfg: the `optim` ConfigDict (lr schedule fields + b1, b2, eps, weight_decay, grad_clip,
    mu_dtype, trainable). Optimizer moments take the params' dtype unless mu_dtype says otherwise;
    with `trainable` only those params get updates and state (clipping sees only their gradients);
    it needs `params` (the param tree, abstract is enough)."""
    schedule = lr_schedule(cfg)
    mu_dtype = jnp.dtype(cfg.mu_dtype) if cfg.get("mu_dtype") else None
    chain = []
    if cfg.grad_clip and cfg.grad_clip > 0:
        chain.append(optax.clip_by_global_norm(cfg.grad_clip))
    chain.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, mu_dtype=mu_dtype,
                             weight_decay=cfg.weight_decay, mask=_decay_mask))
    return masked(optax.chain(*chain), cfg.get("trainable", ""), params), schedule
