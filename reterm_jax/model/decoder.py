"""The text decoder: embeddings, layers (Qwen3.5's hybrid DeltaNet / gated attention, or Llama /
Qwen3 full attention; model/config.py), final norm, head.

    logits = model(input_ids, positions=None, segment_ids=None)                 # [B,T,V] fp32
    logits, cache = model(input_ids, positions=..., segment_ids=..., cache=c)    # prefill/decode/continue

Parameter paths are HF's names minus the `model.` / `model.language_model.` prefix (a Linear's
`weight` is `kernel` transposed, `embed_tokens.weight` is `embedding`), so HF conversion is a
short table (reterm_jax.model.hf_io).
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx, struct

from reterm_jax.model.attention import GatedAttention
from reterm_jax.model.cache import Cache, write_slots
from reterm_jax.model.config import LINEAR_ATTENTION, Qwen3_5Config
from reterm_jax.model.deltanet import GatedDeltaNet, segment_starts
from reterm_jax.model.mlp import MLP
from reterm_jax.model.norms import RMSNorm, stat_dtype
from reterm_jax.model.params import dense, sharding_metadata
from reterm_jax.model.rope import rope_cos_sin
from reterm_jax.model.scan import block_period, scan_decoder_layers
from reterm_jax.model.stacked import stack_layers, unstack_blocks, unstacked_state
from reterm_jax.model.vocab_chunks import target_logprobs
from reterm_jax.parallel.rules import logical_to_spec


@struct.dataclass
class LayerInputs:
    """Per-call tensors every layer reads (computed once per forward, not per layer)."""
    cos: jax.Array
    sin: jax.Array
    segment_ids: jax.Array               # [B, T]
    reset: jax.Array                     # [B, T] DeltaNet segment starts
    index: jax.Array | None = None       # [B] each row's cache write slot
    kv_segments: jax.Array | None = None  # [B, L] cache slot segments incl. this call


class DecoderLayer(nnx.Module):
    """Pre-norm block: h += mixer(norm1(h)); h += mlp(norm2(h))."""

    def __init__(self, config: Qwen3_5Config, layer_type: str, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.is_linear = layer_type == LINEAR_ATTENTION
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, **kw)
        else:
            self.self_attn = GatedAttention(config, **kw)
        self.mlp = MLP(config, **kw)
        h, eps = config.hidden_size, config.rms_norm_eps
        norm = dict(param_dtype=param_dtype, offset=config.norm_offset)
        self.input_layernorm = RMSNorm(h, eps, "norm", **norm)
        self.post_attention_layernorm = RMSNorm(h, eps, "norm", **norm)

    def __call__(self, h: jax.Array, inputs: LayerInputs, cache=None):
        # With sequence parallelism h arrives split over its length (constrain_rows); each mixer
        # and the MLP take whole rows (gathered after the norm) and their output sums are
        # scattered back by the residual add.
        x = whole_rows(self.input_layernorm(h))
        if self.is_linear:
            x, cache = self.linear_attn(x, inputs.segment_ids, inputs.reset, cache)
        else:
            x, cache = self.self_attn(x, inputs.cos, inputs.sin, inputs.segment_ids, cache=cache,
                                      index=inputs.index, kv_segments=inputs.kv_segments)
        h = constrain_rows(h + x)
        h = constrain_rows(h + self.mlp(whole_rows(self.post_attention_layernorm(h))))
        return h, cache


def _run_layer(layer: DecoderLayer, h, inputs, cache):
    h, cache = layer(h, inputs, cache)
    return constrain_rows(h), cache


def _constrain(h: jax.Array, names) -> jax.Array:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return h
    return jax.lax.with_sharding_constraint(h, logical_to_spec(names, mesh, shape=h.shape))


def constrain_rows(h: jax.Array) -> jax.Array:
    """Hidden states [B,T,H] between layers: rows over the data-parallel axes (the "batch" rule)
    and the length as the "activation_length" rule says (sequence parallelism over "tensor"),
    when traced under a mesh context (`with jax.set_mesh(mesh)`); a no-op without one. Without
    it XLA's propagation follows the params' "embed" -> fsdp sharding instead and every device
    computes all rows (measured: the 9B's full-batch fp32 logits on every device, docs/plan.md)."""
    return _constrain(h, ("batch", "activation_length", None))


def whole_rows(h: jax.Array) -> jax.Array:
    """[B,T,H] with each row's whole length on the device (the "length" rule): a mixer's or the
    MLP's input, gathered from the sequence-parallel layout of `constrain_rows`."""
    return _constrain(h, ("batch", "length", None))


class TextModel(nnx.Module):
    """`model.*` of the checkpoint: embed_tokens, layers, norm. Returns final hidden states.

    The layers are either per layer (`self.layers`, HF's `layers.{i}`) or, with scan_layers,
    stacked by block position (`self.blocks`, params [n_blocks, ...]; model/stacked.py)."""

    def __init__(self, config: Qwen3_5Config, *, dtype, param_dtype, remat, rngs: nnx.Rngs,
                 scan_layers: bool = False):
        self.config = config
        self.dtype = dtype
        self.remat = remat
        self.embed_tokens = nnx.Embed(
            config.vocab_size, config.hidden_size, dtype=dtype, param_dtype=param_dtype,
            embedding_init=jax.nn.initializers.normal(config.initializer_range),
            embedding_metadata=sharding_metadata(("vocab", "embed")), rngs=rngs)
        # built per layer first either way, so a seed gives the same weights in both layouts
        self.layers = nnx.List([
            DecoderLayer(config, layer_type, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
            for layer_type in config.layer_types])
        self.blocks = nnx.data(None)  # a data attribute either way (it holds the params when stacked)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, "norm", param_dtype=param_dtype,
                            offset=config.norm_offset)
        self.set_scan_layers(scan_layers)

    @property
    def scan_layers(self) -> bool:
        """Whether the layers are stored stacked and run as a lax.scan (see set_scan_layers)."""
        return self.blocks is not None

    def set_scan_layers(self, scan: bool) -> None:
        """Restack the layers in place: True stores them by block position with a leading
        [n_blocks] axis and runs forwards without a cache as a lax.scan; False, per layer. Works
        on an abstract model (nnx.eval_shape) too. The param tree changes (layers.{i} <->
        blocks.{j}), so do it before splitting params, optimizer state or shardings off the model."""
        if bool(scan) == self.scan_layers:
            return
        if scan:
            period = block_period(self.config.layer_types)
            self.blocks = nnx.List(stack_layers(list(self.layers), period))
            self.layers = nnx.data(None)
        else:
            self.layers = nnx.List(unstack_blocks(list(self.blocks)))
            self.blocks = nnx.data(None)

    def _layer(self, i: int) -> DecoderLayer:
        if self.blocks is None:
            return self.layers[i]
        period = len(self.blocks)
        graphdef, state = nnx.split(self.blocks[i % period])
        return nnx.merge(graphdef, unstacked_state(state, i // period))

    def __call__(self, input_ids, positions=None, segment_ids=None, cache: Cache | None = None):
        """Hidden states [B,T,H] (compute dtype), and the updated cache when one is given."""
        b, t = input_ids.shape
        cfg = self.config
        if segment_ids is None:  # one unpadded sequence per row (continuing the cached one)
            segment_ids = (jnp.ones((b, t), jnp.int32) if cache is None else
                           jnp.broadcast_to(jnp.maximum(cache.last_segment, 1)[:, None], (b, t)))
        segment_ids = segment_ids.astype(jnp.int32)
        if positions is None:
            start = 0 if cache is None else cache.next_position[:, None]
            positions = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
        positions = positions.astype(jnp.int32)
        last_segment = jnp.zeros((b,), jnp.int32) if cache is None else cache.last_segment
        cos, sin = rope_cos_sin(positions, cfg.rotary_dim, cfg.rope_theta, self.dtype)
        inputs = LayerInputs(cos=cos, sin=sin, segment_ids=segment_ids,
                             reset=segment_starts(segment_ids, last_segment))
        if cache is not None:
            kv_segments = write_slots(cache.segment_ids, segment_ids, cache.index, ("batch", None))
            inputs = inputs.replace(index=cache.index, kv_segments=kv_segments)

        h = constrain_rows(self.embed_tokens(input_ids))
        # Scanned only without a cache: with one, stacking the per-layer K/V buffers and states
        # on each call would copy the whole cache every decode step. A stacked model with a cache
        # runs the loop on slices of its blocks (the sampler keeps a per-layer copy instead).
        if self.scan_layers and cache is None:
            h = scan_decoder_layers(self.blocks, h, inputs, dtype=self.dtype, remat=self.remat,
                                    constrain=constrain_rows)
            return self.norm(h)
        run = _run_layer
        if self.remat:
            policy = self.remat if callable(self.remat) else None
            run = nnx.remat(_run_layer, policy=policy)
        new_layers = []
        for i in range(len(cfg.layer_types)):
            h, layer_cache = run(self._layer(i), h, inputs, None if cache is None else cache.layers[i])
            new_layers.append(layer_cache)
        h = self.norm(h)
        if cache is None:
            return h
        return h, _advance(cache, tuple(new_layers), inputs.kv_segments, segment_ids, positions)


def _advance(cache: Cache, layers: tuple, kv_segments, segment_ids, positions) -> Cache:
    """Bookkeeping after writing T slots: per row, the write index moves past the row's last real
    token of the call (pad slots after it stay free), and that token's segment and position."""
    t = segment_ids.shape[1]
    real = segment_ids != 0
    last = jnp.max(jnp.where(real, jnp.arange(t), -1), axis=1)
    has_real = last >= 0
    pick = lambda x: jnp.take_along_axis(x, jnp.maximum(last, 0)[:, None], axis=1)[:, 0]
    return Cache(
        layers=layers, index=jnp.minimum(cache.index + last + 1, cache.max_length), segment_ids=kv_segments,
        last_segment=jnp.where(has_real, pick(segment_ids), cache.last_segment),
        next_position=jnp.where(has_real, pick(positions) + 1, cache.next_position),
    )


# Positions per LM-head chunk in `token_logprobs` (the training losses): temp memory is
# O(B * LOGITS_CHUNK * V) instead of O(B * T * V). 0 = one chunk (full logits).
LOGITS_CHUNK = 1024


class Qwen3_5ForCausalLM(nnx.Module):
    """The text decoder with its LM head (tied to the embedding when the config says so).

    dtype: compute dtype of activations and matmuls; param_dtype: storage dtype of parameters
    (except `linear_attn.A_log` and `linear_attn.norm.weight`, always fp32). Norm statistics,
    softmax, DeltaNet gates/decays and state are fp32 whatever `dtype`; logits are fp32.
    remat: False, True (recompute each decoder layer in the backward pass), or a
    `jax.checkpoint_policies` policy.
    scan_layers: store the layers stacked by block position (`model.blocks.{j}`, params
    [n_blocks, ...]; model/stacked.py) and run forwards without a cache as a lax.scan over the
    repeated block of `config.layer_types` (8 x [3 DeltaNet + 1 attention] for the 9B): same
    math, compile time independent of depth (reterm_jax.model.scan). hf_io and convert map the
    stacked params to HF's per-layer names. `model.model.set_scan_layers(flag)` restacks an
    existing (or abstract) model in place.
    logits_chunk: positions per LM-head chunk in `token_logprobs` (static, like remat).
    """

    def __init__(self, config: Qwen3_5Config, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 remat: bool | Callable = False, scan_layers: bool = False, logits_chunk: int = LOGITS_CHUNK,
                 rngs: nnx.Rngs | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        self.logits_chunk = int(logits_chunk)  # static: positions per LM-head chunk in token_logprobs
        self.model = TextModel(config, dtype=dtype, param_dtype=param_dtype, remat=remat, rngs=rngs,
                               scan_layers=scan_layers)
        if config.tie_word_embeddings:
            self.lm_head = None  # logits use embed_tokens.embedding.T
        else:
            self.lm_head = dense(config.hidden_size, config.vocab_size, ("embed", "vocab"),
                                 init_std=config.initializer_range, dtype=dtype,
                                 param_dtype=param_dtype, rngs=rngs)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """fp32 logits from final hidden states (accumulated in fp32, not rounded to bf16 first).

        Rows longer than `logits_chunk` positions run the head one chunk at a time (a lax.map:
        the same products, row by row). Why: XLA:CPU's YNNPACK fusion otherwise merges the head's
        [T, H] x [H, V] dot with the last layer's MLP and projections into one fused call that
        costs ~6x the whole rest of the forward at T = 8192 (measured: 27.7 s vs 4.2 s for
        bench/model_forward.py's model; docs/performance.md); a loop body is a fusion boundary."""
        f = stat_dtype(hidden.dtype)
        weight, vocab_first = self.head()
        weight = weight.astype(hidden.dtype)
        spec = "bth,vh->btv" if vocab_first else "bth,hv->btv"
        head = lambda h: jnp.einsum(spec, h, weight, preferred_element_type=f)
        b, t, d = hidden.shape
        chunk = self.logits_chunk
        if chunk <= 0 or t <= chunk:
            return head(hidden)
        n = -(-t // chunk)
        padded = jnp.pad(hidden, ((0, 0), (0, n * chunk - t), (0, 0)))
        pieces = jax.lax.map(head, jnp.moveaxis(padded.reshape(b, n, chunk, d), 1, 0))
        return jnp.moveaxis(pieces, 0, 1).reshape(b, n * chunk, -1)[:, :t]

    def head(self) -> tuple[jax.Array, bool]:
        """(LM head weight, vocab_first): the tied embedding [V, H] or lm_head.kernel [H, V]."""
        if self.lm_head is None:
            return self.model.embed_tokens.embedding[...], True
        return self.lm_head.kernel[...], False

    def token_logprobs(self, input_ids, targets, positions=None, segment_ids=None, *,
                       temperature: float = 1.0, with_entropy: bool = False):
        """(log p(targets) [B, T], entropy [B, T] or None) under softmax(logits / temperature),
        fp32, without building [B, T, V] logits: the head runs `logits_chunk` positions at a time
        (model/vocab_chunks.py). targets[b, t] is the token position t predicts."""
        hidden = self.model(input_ids, positions=positions, segment_ids=segment_ids)
        weight, vocab_first = self.head()
        return target_logprobs(hidden, weight, targets, vocab_first=vocab_first, chunk=self.logits_chunk,
                               temperature=temperature, with_entropy=with_entropy)

    def __call__(self, input_ids, positions=None, segment_ids=None, cache: Cache | None = None):
        """input_ids [B,T] int; positions [B,T] (default: arange, or continuing the cache);
        segment_ids [B,T] (0 = padding; default: one sequence per row). Returns fp32 logits
        [B,T,V], plus the updated cache when `cache` is given."""
        out = self.model(input_ids, positions=positions, segment_ids=segment_ids, cache=cache)
        if cache is None:
            return self.logits(out)
        hidden, cache = out
        return self.logits(hidden), cache
