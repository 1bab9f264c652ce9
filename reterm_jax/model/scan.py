"""The decoder layers as a `lax.scan` over repeated blocks, with the per-layer parameter tree.

The 9B's 32 layers are 8 copies of one block [DeltaNet, DeltaNet, DeltaNet, Attention]. Traced
as a Python loop, XLA compiles 32 layer bodies; scanned, it compiles one block, so compile
time stops growing with depth.

The params are stored stacked (model/stacked.py: `model.blocks.{j}.*` with a leading [n_blocks]
axis, entry k = layer j + k*p), so the scan slices one block's params per step in place: no
stacked copy of every layer param per step, and the gradient comes out stacked like the params.
Inside the body, linear kernels are cast to the compute dtype (what nnx.Linear casts them to
anyway: bit-identical), one block at a time; norms, conv taps, A_log and dt_bias stay as
stored (their math is fp32).

Remat applies per layer inside the scanned body (as in the loop), so full remat still keeps
one input per layer (scan residuals [blocks, B, T, H] per position in the block) and one
layer's internals (`remat_on_cotangent` keeps XLA from recomputing a block's layers at once).
remat="block" keeps one input per block instead (a quarter at the 9B's period), for a third
forward pass in the backward. The generation cache is not scanned (see TextModel).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from reterm_jax.model.stacked import strip_layers_axis


def block_period(layer_types: Sequence[str]) -> int:
    """Length of the smallest block that `layer_types` repeats (4 for the 9B); an error if the
    pattern repeats no block (a scan would then cover one block: no gain, so say so)."""
    n = len(layer_types)
    for p in range(1, n + 1):
        if n % p == 0 and all(layer_types[i] == layer_types[i % p] for i in range(n)):
            if p == n and n > 1:
                break
            return p
    raise ValueError(
        f"scan_layers=True needs layer_types to repeat a block of layers (the 9B is 8 x [3 DeltaNet + "
        f"1 attention]); {list(layer_types)} repeats none. Use scan_layers=False for this config.")


def _compute_copy(state: nnx.State, dtype) -> nnx.State:
    """Linear kernels in the compute dtype (what nnx.Linear would cast them to); the rest as is."""
    def cast(path, x):
        name = path[-2] if path and isinstance(path[-1], jax.tree_util.GetAttrKey) else path[-1]
        return x.astype(dtype) if getattr(name, "key", None) == "kernel" else x
    return jax.tree_util.tree_map_with_path(cast, state)


def _tie(x: jax.Array, zero: jax.Array) -> jax.Array:
    """x, computed from `zero` (0 * an element of the cotangent) so that it cannot be used earlier.

    XLA folds neither `x + 0.0 * c` nor `c != c` for floats (NaN semantics), so these stay real
    operands. The result equals x unless the cotangent is inf/NaN, where the gradient is not
    finite anyway."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return x + zero.astype(x.dtype)
    not_finite = zero != zero
    if x.dtype == jnp.bool_:
        return x | not_finite
    return x + not_finite.astype(x.dtype)


def remat_on_cotangent(fn: Callable, policy: Callable | None = None) -> Callable:
    """Full remat of `fn(h, state, inputs)` whose recomputation cannot start before the cotangent arrives.

    Same values and gradients as `jax.checkpoint(fn)`: the forward keeps only the arguments and
    the backward recomputes `fn` to pull the cotangent back. The difference is scheduling. In the
    backward of a scanned block every layer's saved input is available from the start, so XLA is
    free to run all four layers' recomputations at once and keep their internals live together
    (measured on the 9B block: 4x one layer's working set). Here `h` and `inputs` are made to depend
    on the incoming cotangent (an `optimization_barrier`, which XLA:CPU drops, and `_tie`), which
    ties each recomputation to the moment its layer's backward begins: one layer's internals at a
    time. `state` (the params) stays untied so their gathers can still be prefetched.

    policy: a `jax.checkpoint` policy; the values it saves are kept as well and are not
    recomputed (e.g. flash attention's output under `model.remat=attention`). The forward is then
    `jax.vjp` of `jax.checkpoint(fn, policy)` and the residuals are its pullback's; all of them but
    the params are tied to the cotangent."""
    @jax.custom_vjp
    def run(*args):
        return fn(*args)

    def zero_of(cotangent):  # 0 * one element of the cotangent (see _tie)
        return 0 * jax.tree.leaves(cotangent)[0].reshape(-1)[0]

    if policy is None:
        def forward(*args):
            return fn(*args), args

        def backward(args, cotangent):
            args, cotangent = jax.lax.optimization_barrier((args, cotangent))
            # XLA:CPU drops optimization barriers before scheduling; a data dependence on the
            # cotangent holds there too (see _tie).
            h, state, inputs = args  # the params (state) stay untied: their gathers may still be prefetched
            zero = zero_of(cotangent)
            h, inputs = jax.tree.map(lambda x: _tie(x, zero), (h, inputs))
            _, pull = jax.vjp(fn, h, state, inputs)
            return pull(cotangent)
    else:
        checkpointed = jax.checkpoint(fn, policy=policy, prevent_cse=False)
        params_at = {}  # which pullback residuals are the params: found by identity at trace time

        def forward(h, state, inputs):
            out, pull = jax.vjp(checkpointed, h, state, inputs)
            ids = {id(x) for x in jax.tree.leaves(state)}
            params_at["mask"] = tuple(id(x) in ids for x in jax.tree.leaves(pull))
            return out, pull

        def backward(pull, cotangent):
            pull, cotangent = jax.lax.optimization_barrier((pull, cotangent))
            leaves, treedef = jax.tree.flatten(pull)
            mask = params_at.get("mask")
            if mask is None or len(mask) != len(leaves):  # not traced with this forward: tie all
                mask = (False,) * len(leaves)
            zero = zero_of(cotangent)
            leaves = [x if is_param else _tie(x, zero) for x, is_param in zip(leaves, mask)]
            return jax.tree.unflatten(treedef, leaves)(cotangent)

    run.defvjp(forward, backward)
    return run


def scan_decoder_layers(blocks: Sequence[nnx.Module], h: jax.Array, inputs, *,
                        dtype, remat: bool | str | Callable, constrain: Callable = lambda h: h) -> jax.Array:
    """h after all layers (no cache), computed as a scan over the stacked `blocks` (one module
    per block position, params [n_blocks, ...]: model/stacked.py).

    remat: False; True (each layer recomputed in the backward; one saved input per layer);
    "block" (one saved input per block: the backward recomputes the block's forward, then
    each layer again as under True: a third forward pass, for a quarter of the saved inputs);
    or a jax.checkpoint policy applied per layer (through remat_on_cotangent: what it saves is kept)."""
    graphdefs, stacked = zip(*(nnx.split(b) for b in blocks))

    def layer_fn(graphdef):
        def run(h, state, inputs):
            # the cast is inside the (rematerialised) layer: one block's kernels at a time
            out, _ = nnx.merge(graphdef, _compute_copy(state, dtype))(h, inputs, None)
            return constrain(out)
        if remat is True or remat == "block":
            return remat_on_cotangent(run)
        if remat:  # a checkpoint policy: what it saves is kept, the rest recomputed as under True
            return remat_on_cotangent(run, policy=remat)
        return run

    runs = [layer_fn(g) for g in graphdefs]

    def block(h, block_states, inputs):
        for run, state in zip(runs, block_states):
            h = run(h, strip_layers_axis(state), inputs)
        return h

    if remat == "block":
        block = remat_on_cotangent(block)
    h, _ = jax.lax.scan(lambda h, block_states: (block(h, block_states, inputs), None), h, tuple(stacked))
    return h
