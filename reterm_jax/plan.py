"""Per-device memory plan of a training config, optionally checked against XLA's own numbers.

    python -m reterm_jax.plan --config=configs/sft.py:qwen3_5_9b --devices=8 --preset=fsdp_tp
    python -m reterm_jax.plan --config=configs/sft.py:qwen3_5_9b --config.data.seq_len=4096 \
        --config.train.batch_size=8 --devices=8 --preset=fsdp --compile

Needs no accelerator and no weights (shapes only; the 9B preset plans without `hf_path`).
Parameters, optimizer state and gradients are exact (shard shapes from the one rules table,
reterm_jax.parallel.rules); activations and rollout caches are formulas (docs/plan.md).
`--compile` ahead-of-time compiles the real train step (train/step.py) for `--devices` fake CPU
devices in a subprocess (XLA_FLAGS must be set before jax is imported) and prints
`compiled.memory_analysis()` beside the estimate, and the lower/compile times; for a GRPO
config also one rollout worker's sampler (decode loop and prefill chunk, reterm_jax/plan_rollout.py).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from ml_collections import config_flags

from reterm_jax.errors import UserError
from reterm_jax.model.config import FULL_ATTENTION, Qwen3_5Config
from reterm_jax.model.hf_io import abstract_model
from reterm_jax.parallel.mesh import MESH_AXES, resolve_mesh_shape
from reterm_jax.parallel.presets import apply_preset
from reterm_jax.model.delta_rule import GROUP_TOKENS
from reterm_jax.model.scan import block_period
from reterm_jax.parallel.rules import LOGICAL_RULES, logical_to_spec, variable_axes
from reterm_jax.plan_common import memory_stats, plan_model_config, worker_rows
from reterm_jax.train.trainable import is_masked

HBM = {"h200": 141e9, "h100": 80e9, "tpu_v5p": 95e9, "tpu_v5e": 16e9, "tpu_v6e": 32e9, "tpu_v4": 32e9}
GB = 1e9


def _mesh_sizes(cfg, n_devices: int) -> dict:
    return dict(zip(MESH_AXES, resolve_mesh_shape([cfg.mesh[a] for a in MESH_AXES], n_devices)))


def _shard_elems(shape, spec, sizes) -> int:
    n = 1
    for i, dim in enumerate(shape):
        axes = spec[i] if i < len(spec) else None
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        n *= dim // math.prod(sizes[a] for a in axes)
    return n


def train_view(cfg):
    """The config as the train step sees it. SFT: unchanged. GRPO (configs/grpo.py): its rows are
    stream.groups_per_step x rollout.group_size trajectories of train.seq_len tokens, set as
    train.batch_size and data.seq_len (the fields the planner and the SFT presets read)."""
    if cfg.get("mode") != "grpo":
        return cfg
    import ml_collections
    c = cfg.copy_and_resolve_references()
    with c.unlocked():
        c.data = ml_collections.ConfigDict(dict(seq_len=int(cfg.train.seq_len)))
        c.train.batch_size = int(cfg.stream.groups_per_step * cfg.rollout.group_size)
    return c


def grpo_rollout_rows(cfg) -> int:
    """Rows the GRPO rollout side decodes at once: every worker's (worker_rows)."""
    return max(1, cfg.rollout.workers) * worker_rows(cfg)


def _optimizer(cfg, abs_params):
    from reterm_jax.train.optimizer import make_optimizer
    optim = cfg.optim.copy_and_resolve_references()
    optim.decay_steps = optim.decay_steps or cfg.train.steps
    optim.warmup_steps = min(optim.warmup_steps, optim.decay_steps - 1)
    return make_optimizer(optim, abs_params)


def estimate(cfg, n_devices: int, *, rollout_batch: int = 0, rollout_len: int = 0,
             scan_layers: bool = True) -> dict:
    """Per-device bytes of a train config on `n_devices` (see docs/plan.md for the formulas)."""
    config = plan_model_config(cfg.model)
    sizes = _mesh_sizes(cfg, n_devices)
    mesh = jax.sharding.AbstractMesh(tuple(sizes.values()), tuple(sizes))
    dtype, param_dtype = jnp.dtype(cfg.model.dtype), jnp.dtype(cfg.model.param_dtype)
    params = nnx.state(abstract_model(config, dtype, param_dtype), nnx.Param)

    # exact: every param's shard under the rules table; moments mirror their param
    fraction = jax.tree.map(
        lambda v: _shard_elems(v.shape, logical_to_spec(variable_axes(v), mesh, shape=v.shape), sizes)
        / math.prod(v.shape), params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    fraction = nnx.to_pure_dict(fraction)
    abs_params = nnx.to_pure_dict(params)
    elems = sum(math.prod(p.shape) * f for p, f in zip(jax.tree.leaves(abs_params), jax.tree.leaves(fraction)))
    param_bytes = sum(math.prod(p.shape) * p.dtype.itemsize * f
                      for p, f in zip(jax.tree.leaves(abs_params), jax.tree.leaves(fraction)))
    tx, _ = _optimizer(cfg, abs_params)
    opt_shapes = jax.eval_shape(tx.init, abs_params)
    opt_bytes = sum(jax.tree.leaves(optax.tree_utils.tree_map_params(  # frozen params (optim.trainable): none
        tx, lambda x, f: 0 if is_masked(x) else math.prod(x.shape) * x.dtype.itemsize * f, opt_shapes, fraction,
        transform_non_params=lambda x: math.prod(x.shape) * x.dtype.itemsize, is_leaf=is_masked)))
    grad_bytes = 2 * 4 * elems  # fp32 accumulator + one micro-batch's gradient (train/step.py)
    # The embedding / LM-head gradients of a micro-batch are full [V/tp, H] fp32 partial sums on
    # every device before XLA reduce-scatters them over fsdp.
    tp = sizes["tensor"]
    heads = (1 if config.tie_word_embeddings else 2) * _split(config.vocab_size, tp) * config.hidden_size * 4
    grad_bytes += heads
    # scan_layers: the params are stored stacked (model/stacked.py), so the scan slices them in
    # place and its gradient is the gradient. What the body holds per block: the block's params
    # gathered over fsdp, their compute-dtype cast, and their gradient before it is reduce-scattered
    # (model/scan.py)
    layer_elems = elems - heads / 4 / sizes["fsdp"]
    n_blocks = len(config.layer_types) // block_period(config.layer_types) if scan_layers else 1
    scan_copy = (layer_elems / n_blocks * sizes["fsdp"] * (2 * param_dtype.itemsize + dtype.itemsize)
                 if scan_layers else 0)

    # activations of one micro-batch on one device
    n_dp = sizes["data"] * sizes["fsdp"]
    micro_rows = cfg.train.batch_size // max(1, cfg.train.micro_batches)
    rows = math.ceil(micro_rows / n_dp)
    seq = cfg.data.seq_len
    act = activation_bytes(config, rows, seq, dtype.itemsize, tp, cfg.model.remat,
                           attention_impl=cfg.model.get("attention_impl", "auto"),
                           logits_chunk=int(cfg.model.get("logits_chunk", 0)),
                           delta_group_tokens=int(cfg.model.get("delta_group_tokens", GROUP_TOKENS)))
    batch_bytes = rows * cfg.train.micro_batches * seq * (4 * 4 + 1)  # 4 int32 arrays + bool mask

    out = dict(params=param_bytes, optimizer=opt_bytes, gradients=grad_bytes, scan_copy=scan_copy, **act,
               batch=batch_bytes, mesh=sizes, rows_per_device=rows, param_elems_per_device=elems)
    out["train_total"] = (param_bytes + opt_bytes + grad_bytes + scan_copy + act["activations"] + act["logits"]
                          + batch_bytes)
    if cfg.get("mode") == "grpo":
        # Beside the train state on the same devices: the PolicyStore's published copy of the
        # params (same sharding, in rollout.param_dtype: what the samplers read), the frozen
        # reference when kl_coef > 0, and the samplers' caches: each worker's rows split over
        # data x fsdp (as far as they divide) and K/V heads over tensor (rl/inference/sampler.py).
        inference = jnp.dtype(cfg.rollout.get("param_dtype") or param_dtype)
        whole = sizes["fsdp"] if cfg.rollout.weights_sharding == "tensor" else 1  # "embed" whole
        out["policy_copy"] = param_bytes * inference.itemsize / param_dtype.itemsize * whole
        out["reference"] = param_bytes if cfg.loss.kl_coef > 0 else 0
        out["rollout_rows"] = rollout_batch
        workers = max(1, cfg.rollout.workers)
        per_worker = math.ceil(rollout_batch / workers)
        split = next((d for d in (sizes["data"] * sizes["fsdp"], sizes["data"]) if per_worker % d == 0), 1)
        kv = jnp.dtype(cfg.rollout.get("kv_cache_dtype") or dtype).itemsize
        out["rollout_cache"] = workers * rollout_cache_bytes(config, per_worker // split, rollout_len,
                                                             dtype.itemsize, tp, kv) if rollout_batch else 0
        out["grpo_total"] = out["train_total"] + out["policy_copy"] + out["reference"] + out["rollout_cache"]
    elif rollout_batch:
        out["rollout_cache"] = rollout_cache_bytes(config, math.ceil(rollout_batch / n_dp), rollout_len,
                                                   dtype.itemsize, tp)
        out["rollout_total"] = param_bytes + out["rollout_cache"]
    return out


def peak_bytes(est: dict) -> float:
    """What has to fit on one device: the train step, plus (GRPO) the rollout side beside it."""
    return est.get("grpo_total", est["train_total"])


def advice(cfg, n_devices: int, hbm: float, *, rollout_batch: int, rollout_len: int, scan_layers: bool = True,
           preset_name: str = "") -> list[str]:
    """When a plan does not fit: single changes to the config (each estimated, so only the ones
    that fit are named), or what comes closest."""
    from reterm_jax.parallel.presets import PRESETS
    grpo = cfg.get("mode") == "grpo"
    tries = []
    if cfg.model.remat not in ("full", "block"):
        tries.append(("--config.model.remat=full", lambda c: c.model.update(dict(remat="full"))))
    if cfg.model.remat == "full" and scan_layers:
        tries.append(("--config.model.remat=block", lambda c: c.model.update(dict(remat="block"))))
    for k in (2, 4, 8):
        m = cfg.train.micro_batches * k
        if cfg.train.batch_size % m == 0:
            tries.append((f"--config.train.micro_batches={m}", lambda c, m=m: c.train.update(dict(micro_batches=m))))
    for name in PRESETS:
        if name != preset_name and n_devices % PRESETS[name]["mesh"]["tensor"] == 0:
            tries.append((f"--preset={name}", name))
    tries.append((f"--devices={2 * n_devices}", 2 * n_devices))
    half = cfg.data.seq_len // 2
    tries.append((f"--config.{'train' if grpo else 'data'}.seq_len={half}",
                  lambda c: c.data.update(dict(seq_len=half))))
    if grpo and jnp.dtype(cfg.rollout.get("kv_cache_dtype") or cfg.model.dtype).itemsize > 1:
        tries.append(("--config.rollout.kv_cache_dtype=float8_e4m3fn",
                      lambda c: c.rollout.update(dict(kv_cache_dtype="float8_e4m3fn"))))
    if grpo and cfg.rollout.weights_sharding == "tensor":
        tries.append(("--config.rollout.weights_sharding=train (decoding then gathers the weights over fsdp)",
                      lambda c: c.rollout.update(dict(weights_sharding="train"))))
    if grpo and rollout_batch > 1:
        tries.append((f"--rollout_batch={rollout_batch // 2} (fewer rollout.workers or a smaller group)",
                      ("rollout_batch", rollout_batch // 2)))
    results = []
    for label, change in tries:
        c, n, rb = cfg.copy_and_resolve_references(), n_devices, rollout_batch
        try:
            if isinstance(change, str):
                from reterm_jax.parallel.presets import apply_preset
                c = apply_preset(c, change, n)
            elif isinstance(change, int):
                n = change
            elif isinstance(change, tuple):
                rb = change[1]
            else:
                with c.unlocked():
                    change(c)
            total = peak_bytes(estimate(c, n, rollout_batch=rb, rollout_len=rollout_len, scan_layers=scan_layers))
        except Exception as e:  # noqa: BLE001 - a change that does not apply is just not advice
            results.append((float("inf"), label, f"does not apply ({e})"))
            continue
        results.append((total, label, f"{total / GB:.1f} GB"))
    fits = [r for r in results if r[0] <= hbm]
    if fits:
        return ["it fits with any one of: " + "; ".join(f"{label} ({text})" for _, label, text in sorted(fits))]
    best = sorted(r for r in results if r[0] < float("inf"))[:3]
    return ["no single change fits; closest: " + "; ".join(f"{label} ({text})" for _, label, text in best)
            + " (combine them, or shorten the rows)"]


def _split(n: int, tp: int) -> float:
    return n / tp if n % tp == 0 else n  # a dim the tensor axis does not divide is replicated


def activation_bytes(config: Qwen3_5Config, rows: int, seq: int, c: int, tp: int, remat: str, *,
                     attention_impl: str = "reference", logits_chunk: int = 0,
                     delta_group_tokens: int = GROUP_TOKENS) -> dict:
    """Activation bytes of one device's micro-batch rows (estimate; docs/plan.md):
    saved  : what the forward keeps for the backward (remat full: each layer's input),
    working: one layer's internals while its backward runs, plus their gradients,
    logits : fp32 logits, their softmax and their gradient (3 x rows x positions x vocab/tp x 4),
             positions = seq, or `logits_chunk` when the losses run the head in chunks."""
    f, h = 4, config.hidden_size
    group = min(seq, delta_group_tokens) if delta_group_tokens > 0 else seq  # model/delta_rule.py
    i = _split(config.intermediate_size, tp)
    cq = _split(config.linear_conv_dim, tp)            # DeltaNet q|k|v channels
    vd = _split(config.linear_value_dim, tp)
    hv = _split(config.linear_num_value_heads, tp)
    nq = _split(config.num_attention_heads, tp)
    qd = nq * config.head_dim
    kvd = _split(config.num_key_value_heads, tp) * config.head_dim
    common = 2 * h * (f + c) + 2 * h * c + 4 * i * c     # two norms, residuals, MLP gate/up/act
    delta = (cq * (2 * c + 2 * f) + vd * (3 * f + 2 * c)  # qkv, conv (fp32), silu, fp32 q/k/v, z, norm
             + hv * config.linear_key_head_dim * config.linear_value_head_dim * f / group)  # group states
    attn = 3 * qd * c + 2 * kvd * c + (qd + kvd) * (f + c)  # q|gate, k, v, norms+rope, output
    if attention_impl == "reference":
        scores = nq * (seq + 128) / 2 * (2 * f + c)        # per query token: scores, probs, weights
    else:  # flash: a log-sum-exp and a dO·O row sum per query head; tiles are counted once below
        scores = nq * 2 * f
    per_token = {t: common + (attn + scores if t == FULL_ATTENTION else delta) for t in set(config.layer_types)}
    tokens = rows * seq
    # sequence parallelism: the hidden states between layers are split over tensor (rules table)
    sp = tp if seq % tp == 0 and LOGICAL_RULES["activation_length"] == "tensor" else 1
    layer_in = tokens * h * c / sp
    working = 2 * tokens * max(per_token.values())
    # the delta rule's chunk-local [64, 64] WY matrices exist for one group of tokens at a time
    working += 2 * rows * group * hv * 64 * 4 * f
    if remat == "full":
        saved = config.num_hidden_layers * layer_in
    elif remat == "attention":  # full, plus flash's output and log-sum-exp per attention layer
        saved = config.num_hidden_layers * layer_in
        if attention_impl != "reference":
            n_attn = sum(t == FULL_ATTENTION for t in config.layer_types)
            saved += n_attn * tokens * (qd * c + nq * f)
    elif remat == "block":  # one input per block, plus one block's layer inputs while it is recomputed
        period = block_period(config.layer_types)
        saved = (config.num_hidden_layers // period + period) * layer_in
    else:  # none (everything kept); "dots" keeps the matmul outputs, counted as all (upper bound)
        saved = tokens * sum(per_token[t] for t in config.layer_types)
    if attention_impl != "reference":  # one [bq, bk] tile's scores, probs and grads, forward or backward
        from reterm_jax.model.flash_attention import BLOCK_K, BLOCK_Q
        working += 2 * rows * nq * min(seq, BLOCK_Q) * min(seq, BLOCK_K) * (3 * f + c)
    positions = min(seq, logits_chunk) if logits_chunk > 0 else seq
    logits = 3 * rows * positions * _split(config.vocab_size, tp) * f
    return dict(activations=saved + working, saved=saved, working=working, logits=logits)


def rollout_cache_bytes(config: Qwen3_5Config, rows: int, length: int, c: int, tp: int,
                        kv_bytes: int | None = None) -> float:
    """Generation cache of `rows` sequences of `length` tokens (model/cache.py): K/V per attention
    layer (`kv_bytes` a value, default the compute dtype's `c`), conv window (compute dtype) +
    fp32 state per DeltaNet layer, slot segment ids."""
    kv_bytes = c if kv_bytes is None else kv_bytes
    n_attn = sum(t == FULL_ATTENTION for t in config.layer_types)
    n_delta = config.num_hidden_layers - n_attn
    kv = 2 * length * _split(config.num_key_value_heads, tp) * config.head_dim * kv_bytes
    delta = ((config.linear_conv_kernel_dim - 1) * _split(config.linear_conv_dim, tp) * c
             + _split(config.linear_num_value_heads, tp) * config.linear_key_head_dim
             * config.linear_value_head_dim * 4)
    return rows * (n_attn * kv + n_delta * delta + length * 4)


# ------------------------------------------------------------------------------ AOT compile


def aot_compile(cfg, scan_layers: bool = True) -> dict:
    """Lower + compile the real train step for the current devices (run under fake CPU devices,
    see compile_in_subprocess); memory_analysis() numbers and timings."""
    from reterm_jax.model.attention import set_attention_impl
    from reterm_jax.model.deltanet import set_delta_group_tokens
    from reterm_jax.parallel.mesh import make_mesh
    from reterm_jax.parallel.rules import state_shardings
    from reterm_jax.train.state import abstract_train_state, batch_sharding, remat_policy, train_state_shardings
    from reterm_jax.train.step import BATCH_KEYS, make_train_step

    mesh = make_mesh(**cfg.mesh)
    config = plan_model_config(cfg.model)
    abstract = abstract_model(config, jnp.dtype(cfg.model.dtype), jnp.dtype(cfg.model.param_dtype),
                              scan_layers=scan_layers)
    abstract.model.remat = remat_policy(cfg.model.remat)  # as train/state.py abstract_params does
    abstract.logits_chunk = int(cfg.model.get("logits_chunk", abstract.logits_chunk))
    set_attention_impl(abstract, cfg.model.get("attention_impl", "auto"))
    set_delta_group_tokens(abstract, cfg.model.get("delta_group_tokens", GROUP_TOKENS))
    graphdef, abs_state = nnx.split(abstract, nnx.Param)
    param_sh = nnx.to_pure_dict(state_shardings(abs_state, mesh))
    abs_params = nnx.to_pure_dict(abs_state)
    tx, schedule = _optimizer(cfg, abs_params)
    shardings = train_state_shardings(tx, abs_params, param_sh, mesh)
    state = abstract_train_state(abs_params, tx, shardings)
    shape = (cfg.train.batch_size, cfg.data.seq_len)
    args = ()
    if cfg.get("mode") == "grpo":  # the GRPO step on its rows (train_view), the reference when kl > 0
        from reterm_jax.rl.grpo.step import BATCH_KEYS as GRPO_KEYS
        from reterm_jax.rl.grpo.step import make_grpo_step
        floats = ("loss_mask", "old_logprobs", "advantages", "weights")
        batch = {k: jax.ShapeDtypeStruct(shape, jnp.float32 if k in floats else jnp.int32,
                                         sharding=batch_sharding(mesh)) for k in GRPO_KEYS}
        step = make_grpo_step(graphdef, tx, schedule, micro_batches=cfg.train.micro_batches, mesh=mesh,
                              shardings=shardings, sampling_temperature=cfg.rollout.temperature, loss_cfg=cfg.loss)
        if cfg.loss.kl_coef > 0:
            args = (state.params,)
    else:
        batch = {k: jax.ShapeDtypeStruct(shape, jnp.bool_ if k == "target_mask" else jnp.int32,
                                         sharding=batch_sharding(mesh)) for k in BATCH_KEYS}
        step = make_train_step(graphdef, tx, schedule, micro_batches=cfg.train.micro_batches, mesh=mesh,
                               shardings=shardings)
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):  # the decoder's row-sharding constraint needs the mesh in context
        lowered = step.lower(state, batch, *args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return dict(memory_stats(compiled), lower_s=t1 - t0, compile_s=t2 - t1, devices=mesh.size,
                scan_layers=scan_layers)


# How `--compile` models an accelerator's memory for the samplers on XLA:CPU. XLA:CPU has no bf16
# dot: it runs each one on fp32 copies of its operands, and in the samplers' programs it keeps
# those copies of every weight for the whole call (7-9 GB of the 9B's decode temp per device,
# docs/plan.md). GPUs and TPUs run bf16 dots as they are. So, unless `--cpu_upcasts`, the rollout
# programs are compiled with the dots' operand conversions fused into the dot (YNNPACK) and without
# while-loop-invariant code motion. The control: an fp32 model has no conversions, and there the
# flags move the 9B worker's decode temp from 7 to 6 MB and its prefill chunk's from 1.82 to 2.29
# GB (up, not down); with bf16 weights they take the decode temp from 7.94 GB to 5 MB and the
# prefill chunk's from 7.57 to 1.82 GB (docs/plan.md). The train step is compiled with XLA:CPU's
# defaults: there the fusion flag also changes what fp32 programs keep. Flags a jaxlib does not
# know abort it, so they are named per measured version.
ACCELERATOR_MODEL_FLAGS: dict[str, dict[str, tuple[str, ...]]] = {
    "0.10.2": {"rollout": ("--xla_cpu_experimental_ynn_fusion_type=dot",
                           "--xla_disable_hlo_passes=while-loop-invariant-code-motion")},
}


def model_flags(what: str, xla_flags: str, jaxlib_version: str | None = None) -> list[str]:
    """The accelerator-model flags for compiling `what` ("train" | "rollout") on this jaxlib,
    less any option the user's XLA_FLAGS already sets; [] for a jaxlib they were not measured on."""
    if jaxlib_version is None:
        import jaxlib
        jaxlib_version = jaxlib.__version__
    from reterm_jax.cpu_flags import unset_flags
    return unset_flags(ACCELERATOR_MODEL_FLAGS.get(jaxlib_version, {}).get(what, ()), xla_flags)


def compile_in_subprocess(cfg, n_devices: int, scan_layers: bool = True, timeout: float | None = None,
                          what: str = "train", cpu_upcasts: bool = False) -> dict:
    """aot_compile (what="train") or plan_rollout.aot_compile_rollout (what="rollout": one GRPO
    worker's sampler) on `n_devices` fake CPU devices in a fresh interpreter (XLA_FLAGS has to be
    set before jax is imported, so it cannot be this process). The rollout programs are compiled
    as an accelerator runs bf16 dots (model_flags) unless `cpu_upcasts`; the result's "xla_flags"
    says what was added."""
    user = os.environ.get("XLA_FLAGS", "")
    added = [] if cpu_upcasts else model_flags(what, user)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=" ".join([user, *added, f"--xla_force_host_platform_device_count={n_devices}"]).strip())
    call = f"aot_compile(cfg, {scan_layers!r})" if what == "train" else "aot_compile_rollout(cfg)"
    code = ("import json, sys, ml_collections; from reterm_jax.plan import aot_compile; "
            "from reterm_jax.plan_rollout import aot_compile_rollout; "
            "cfg = ml_collections.ConfigDict(json.loads(sys.stdin.read())); "
            f"print('PLAN_RESULT ' + json.dumps({call}))")
    proc = subprocess.run([sys.executable, "-c", code], input=cfg.to_json(), env=env, capture_output=True,
                          text=True, timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("PLAN_RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"AOT compile subprocess failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return dict(json.loads(lines[-1][len("PLAN_RESULT "):]), xla_flags=added)


# ------------------------------------------------------------------------------ report


def report(cfg, n_devices: int, est: dict, hbm: float, compiled: dict | None = None,
           rollout: dict | None = None) -> str:
    gb = lambda x: f"{x / GB:9.2f} GB"
    grpo = "grpo_total" in est
    lines = [f"per-device memory plan{' (GRPO: groups_per_step x group_size trajectories per step)' if grpo else ''}: "
             f"{n_devices} devices, mesh {est['mesh']}, remat={cfg.model.remat}, "
             f"seq_len={cfg.data.seq_len}, batch={cfg.train.batch_size} in {cfg.train.micro_batches} "
             f"micro-batches ({est['rows_per_device']} row(s) per device per micro-batch), "
             f"dtype={cfg.model.dtype}, params {cfg.model.param_dtype}",
             f"  parameters       {gb(est['params'])}",
             f"  optimizer state  {gb(est['optimizer'])}   (Adam mu/nu, mu_dtype={cfg.optim.get('mu_dtype') or 'params'})",
             f"  gradients        {gb(est['gradients'])}   (fp32 accumulator + one micro-batch + "
             "unreduced embedding/head)",
             f"  scan block       {gb(est['scan_copy'])}   (one block's params gathered over fsdp, cast to the "
             "compute dtype, and their gradient; the params are stored stacked)",
             f"  activations      {gb(est['activations'])}   (saved {est['saved'] / GB:.2f} + working "
             f"{est['working'] / GB:.2f})",
             f"  logits           {gb(est['logits'])}   (fp32 logits, softmax, gradient; one head chunk)",
             f"  train step total {gb(est['train_total'])}   of {hbm / GB:.0f} GB HBM "
             f"({100 * est['train_total'] / hbm:.0f}%){'  DOES NOT FIT' if est['train_total'] > hbm else ''}"]
    if grpo:
        lines += [f"  policy copy      {gb(est['policy_copy'])}   (the published params the samplers read; "
                  f"split as rollout.weights_sharding={cfg.rollout.weights_sharding})",
                  f"  reference model  {gb(est['reference'])}   (frozen warm start; 0 when loss.kl_coef = 0)",
                  f"  rollout caches   {gb(est['rollout_cache'])}   ({est['rollout_rows']} rows x "
                  f"{cfg.rollout.cache_length} tokens over {max(1, cfg.rollout.workers)} worker(s); rows over "
                  f"data x fsdp, K/V heads over tensor; K/V in {cfg.rollout.get('kv_cache_dtype') or cfg.model.dtype})",
                  f"  GRPO total       {gb(est['grpo_total'])}   of {hbm / GB:.0f} GB HBM "
                  f"({100 * est['grpo_total'] / hbm:.0f}%){'  DOES NOT FIT' if est['grpo_total'] > hbm else ''}"]
    elif "rollout_cache" in est:
        lines += [f"  rollout caches   {gb(est['rollout_cache'])}   (KV + DeltaNet state of this device's rows)",
                  f"  rollout total    {gb(est['rollout_total'])}   (params + caches; "
                  f"{100 * est['rollout_total'] / hbm:.0f}% of HBM)"]
    if compiled:
        args_est = est["params"] + est["optimizer"] + est["batch"]
        temp_est = est["gradients"] + est["scan_copy"] + est["activations"] + est["logits"]
        how = ("with " + " ".join(compiled["xla_flags"]) if compiled.get("xla_flags")
               else "XLA:CPU's defaults: bf16 dots on fp32 copies of their operands")
        lines += [f"XLA memory_analysis (AOT, {compiled['devices']} fake CPU devices, scan_layers="
                  f"{compiled['scan_layers']}; lower {compiled['lower_s']:.1f} s, compile {compiled['compile_s']:.1f} s; "
                  f"{how}):",
                  f"  arguments        {gb(compiled['argument_size_in_bytes'])}   estimate {gb(args_est)}  "
                  f"ratio {compiled['argument_size_in_bytes'] / args_est:.3f}",
                  f"  outputs          {gb(compiled['output_size_in_bytes'])}   "
                  f"(aliased {compiled['alias_size_in_bytes'] / GB:.2f} GB: donated state)",
                  f"  temp             {gb(compiled['temp_size_in_bytes'])}   estimate {gb(temp_est)}  "
                  f"ratio {compiled['temp_size_in_bytes'] / temp_est:.3f}",
                  f"  generated code   {gb(compiled['generated_code_size_in_bytes'])}"]
        total = compiled["argument_size_in_bytes"] + compiled["output_size_in_bytes"] \
            - compiled["alias_size_in_bytes"] + compiled["temp_size_in_bytes"]
        lines.append(f"  total            {gb(total)}   estimate {gb(args_est + temp_est)}  "
                     f"ratio {total / (args_est + temp_est):.3f}")
        if rollout:
            from reterm_jax.plan_rollout import rollout_report
            lines += rollout_report(cfg, rollout, total, hbm)
    return "\n".join(lines)


def _hbm(value: str) -> float:
    if value.lower() in HBM:
        return HBM[value.lower()]
    try:
        return float(value)
    except ValueError:
        raise UserError(f"--hbm={value}: a byte count (e.g. 141e9) or one of {', '.join(sorted(HBM))}") from None


def main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected arguments {argv[1:]}")
    cfg = FLAGS.config
    if cfg is None:
        raise UserError("--config is required, e.g. --config=configs/sft.py:qwen3_5_9b")
    n = FLAGS.devices
    if n < 1:
        raise UserError(f"--devices={n}: must be >= 1")
    hbm = _hbm(FLAGS.hbm)
    if FLAGS.preset:
        from reterm_jax.parallel.presets import PRESETS
        if FLAGS.preset not in PRESETS:
            raise UserError(f"--preset={FLAGS.preset}: choose one of {', '.join(sorted(PRESETS))}")
    grpo = cfg.get("mode") == "grpo"
    cfg = train_view(cfg)
    if FLAGS.preset:
        try:
            # fields typed as --config.* win over the preset's (a preset only fills the rest)
            cfg = apply_preset(cfg, FLAGS.preset, n, keep=set(config_flags.get_override_values(FLAGS["config"])))
        except ValueError as e:
            raise UserError(f"--preset={FLAGS.preset}: {e}") from None
    if grpo:
        rollout_batch = FLAGS.rollout_batch if FLAGS.rollout_batch is not None else grpo_rollout_rows(cfg)
        rollout_len = FLAGS.rollout_len or cfg.rollout.cache_length
    else:
        rollout = cfg.get("rollout", {})
        rollout_batch = FLAGS.rollout_batch if FLAGS.rollout_batch is not None else \
            rollout.get("group_size", 0) * rollout.get("collect_batch", 1)
        rollout_len = FLAGS.rollout_len or rollout.get("max_tokens", 0) or cfg.data.seq_len
    est = estimate(cfg, n, rollout_batch=rollout_batch, rollout_len=rollout_len, scan_layers=FLAGS.scan_layers)
    upcasts = FLAGS.cpu_upcasts
    compiled = compile_in_subprocess(cfg, n, FLAGS.scan_layers, cpu_upcasts=upcasts) if FLAGS.compile else None
    rollout = compile_in_subprocess(cfg, n, what="rollout", cpu_upcasts=upcasts) if FLAGS.compile and grpo else None
    print(report(cfg, n, est, hbm, compiled, rollout))
    if peak_bytes(est) > hbm:
        for line in advice(cfg, n, hbm, rollout_batch=rollout_batch, rollout_len=rollout_len,
                           scan_layers=FLAGS.scan_layers, preset_name=FLAGS.preset):
            print(f"  does not fit: {line}")


if __name__ == "__main__":
    from absl import flags

    from reterm_jax import cli
    config_flags.DEFINE_config_file("config", None, "Train config, e.g. configs/sft.py:qwen3_5_9b")
    flags.DEFINE_integer("devices", 8, "Devices of the target mesh (fake CPU devices with --compile).")
    flags.DEFINE_string("preset", "", "Sharding preset (reterm_jax.parallel.presets): fsdp | fsdp_tp.")
    flags.DEFINE_bool("compile", False, "Also AOT-compile the train step on fake CPU devices and print "
                      "XLA's memory_analysis next to the estimate.")
    flags.DEFINE_bool("cpu_upcasts", False, "With --compile: compile the samplers as XLA:CPU does by default "
                      "(bf16 dots on fp32 copies of every weight, kept for the whole decode loop), not as an "
                      "accelerator runs bf16 dots (plan.ACCELERATOR_MODEL_FLAGS).")
    flags.DEFINE_bool("scan_layers", True, "Compile with the decoder scanned over blocks (bounded compile time).")
    flags.DEFINE_string("hbm", "h200", f"Device memory: bytes or one of {sorted(HBM)}.")
    flags.DEFINE_integer("rollout_batch", None, "Sequences in a rollout batch; default for GRPO configs "
                         "rollout.workers x max(group_size, collect_batch), else 0 (none).")
    flags.DEFINE_integer("rollout_len", 0, "Tokens per rollout sequence; default config.rollout.cache_length "
                         "(GRPO).")
    FLAGS = flags.FLAGS
    cli.run(main)
