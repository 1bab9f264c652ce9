"""The train state (params, optimizer state, step, RNG) and where each of its leaves lives.

Params are kept as the nnx *pure dict* of the model's Params (nested dicts of arrays, HF-like
names as keys): a plain pytree that jit, optax and orbax all take as is, and the same tree
`reterm_jax.convert` reads from `<step>/params`. The module structure (graphdef, incl. dtype
and remat) stays outside, static, and the step merges the two.

Shardings come from the params' logical axis names through the one rules table
(reterm_jax.parallel.rules); optimizer moments mirror their param's sharding, scalars are
replicated.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from reterm_jax.model.attention import resolve_attention_impl, set_attention_impl
from reterm_jax.model.delta_rule import GROUP_TOKENS
from reterm_jax.model.deltanet import set_delta_group_tokens
from reterm_jax.model.flash_attention import LSE_NAME, OUT_NAME
from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM
from reterm_jax.model.hf_io import abstract_model, load_pretrained
from reterm_jax.parallel.rules import logical_to_sharding, state_shardings
from reterm_jax.train.trainable import is_masked

REMAT_POLICIES = {
    "none": False,
    "full": True,  # recompute each decoder layer in the backward pass
    # scanned decoder: keep one input per block of layers (a quarter of full's at the 9B's
    # 4-layer block) for one more forward pass; unscanned, the same as full
    "block": "block",
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs
    # recompute each layer except flash attention's forward: keep its output and log-sum-exp
    # (a [T, Nq, D] and a [T, Nq] per attention layer); with other attention kernels, like full
    "attention": jax.checkpoint_policies.save_only_these_names(OUT_NAME, LSE_NAME),
}


@struct.dataclass
class TrainState:
    step: jax.Array       # int32 scalar: optimizer updates applied so far
    params: Any           # nnx pure dict of the model's Params
    opt_state: Any        # optax state over `params`
    rng: jax.Array        # uint32[2] raw PRNG key, split once per step (saved with the state)


def parse_dtype(name: str, field: str):
    try:
        return jnp.dtype(name)
    except TypeError:
        raise ValueError(f"{field}={name!r} is not a dtype; use 'float32' or 'bfloat16'") from None


def remat_policy(name: str):
    if name not in REMAT_POLICIES:
        raise ValueError(f"model.remat={name!r}: choose one of {sorted(REMAT_POLICIES)}")
    return REMAT_POLICIES[name]


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """[batch, length, ...] arrays: rows over the data-parallel axes (the "batch" rule)."""
    return logical_to_sharding(("batch", "length") + (None,) * (ndim - 2), mesh)


def model_config(cfg) -> Qwen3_5Config:
    """The model's config: from `model.hf_path` when set, else `model.preset` with overrides."""
    if cfg.hf_path:
        return Qwen3_5Config.from_hf_dir(cfg.hf_path)
    if cfg.preset == "tiny":
        return Qwen3_5Config.tiny(**dict(cfg.overrides))
    if cfg.preset == "qwen3_5_9b":
        raise ValueError("model.preset='qwen3_5_9b' trains from pretrained weights: set "
                         "--config.model.hf_path=/path/to/Qwen3.5-9B")
    raise ValueError(f"model.preset={cfg.preset!r}: use 'tiny' (random init) or set model.hf_path")


def abstract_params(cfg, mesh: Mesh):
    """(config, graphdef, abstract params, param shardings) of the `model` config, no memory used."""
    config = model_config(cfg)
    dtype = parse_dtype(cfg.dtype, "model.dtype")
    param_dtype = parse_dtype(cfg.param_dtype, "model.param_dtype")
    # scan_layers: the layers stored stacked by block and run as a lax.scan (compile time, no
    # per-step stacked copy); it changes the param tree (model/stacked.py)
    abstract = abstract_model(config, dtype, param_dtype, scan_layers=bool(cfg.get("scan_layers", False)))
    abstract.model.remat = remat_policy(cfg.remat)  # static module structure: goes in the graphdef
    abstract.logits_chunk = int(cfg.get("logits_chunk", abstract.logits_chunk))  # LM head in chunks (losses)
    impl = cfg.get("attention_impl", "auto")
    resolve_attention_impl(impl, config.head_dim, dtype=dtype)  # a kernel this backend cannot run: say so now
    set_attention_impl(abstract, impl)  # static, in the graphdef
    set_delta_group_tokens(abstract, cfg.get("delta_group_tokens", GROUP_TOKENS))  # delta rule in groups (static)
    graphdef, abs_params = nnx.split(abstract, nnx.Param)
    shardings = nnx.to_pure_dict(state_shardings(abs_params, mesh))
    return config, graphdef, nnx.to_pure_dict(abs_params), shardings


def init_params(cfg, config: Qwen3_5Config, mesh: Mesh, shardings, *, seed: int):
    """Params loaded from `cfg.hf_path` (streamed into their shardings), or randomly initialised
    by a jit with out_shardings (each device builds only its own slice)."""
    dtype = parse_dtype(cfg.dtype, "model.dtype")
    param_dtype = parse_dtype(cfg.param_dtype, "model.param_dtype")
    scan = bool(cfg.get("scan_layers", False))
    if cfg.hf_path:
        model = load_pretrained(cfg.hf_path, dtype, mesh, param_dtype=param_dtype, scan_layers=scan)
        return nnx.to_pure_dict(nnx.state(model, nnx.Param))

    def init():
        model = Qwen3_5ForCausalLM(config, dtype=dtype, param_dtype=param_dtype, scan_layers=scan,
                                   rngs=nnx.Rngs(seed))
        return nnx.to_pure_dict(nnx.state(model, nnx.Param))
    with nnx.use_eager_sharding(False):
        return jax.jit(init, out_shardings=shardings)()


def train_state_shardings(tx: optax.GradientTransformation, abs_params, param_shardings,
                          mesh: Mesh) -> TrainState:
    """Optimizer moments mirror their param's sharding; counters, step and RNG are replicated."""
    opt = optax.tree_utils.tree_map_params(
        tx, lambda x, s: x if is_masked(x) else s, jax.eval_shape(tx.init, abs_params), param_shardings,
        transform_non_params=lambda _: replicated(mesh), is_leaf=is_masked)  # frozen params have no state
    return TrainState(step=replicated(mesh), params=param_shardings, opt_state=opt,
                      rng=replicated(mesh))


def _fresh(tx, seed: int):
    def init(params):
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                          rng=jax.random.PRNGKey(seed))
    return init


def create_train_state(params, tx: optax.GradientTransformation, shardings: TrainState, *,
                       seed: int) -> TrainState:
    """Step 0: fresh optimizer state, RNG from `seed`, everything placed on its sharding."""
    return jax.jit(_fresh(tx, seed), in_shardings=(shardings.params,), out_shardings=shardings,
                   donate_argnums=0)(params)


def abstract_train_state(abs_params, tx: optax.GradientTransformation,
                         shardings: TrainState) -> TrainState:
    """ShapeDtypeStructs with shardings: the restore target of a checkpoint (no memory used)."""
    shapes = jax.eval_shape(_fresh(tx, 0), abs_params)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)
