"""Batched generation on the model's cache: token in, token out.

    sampler = Sampler(model, stop_ids=special.stop, pad_id=special.pad, max_length=4096)
    state = sampler.init(batch_size=4)
    state = sampler.extend(state, prompts)               # prefill (one token list per row)
    state, out = sampler.generate(state, key, SamplingParams(0.7, 20, 0.95), max_new_tokens=512)
    state = sampler.extend(state, observations)          # multi-token continuation, rows may skip
    sampler.contexts(state)                              # per row: every token the cache has seen

How rows of a batch share one cache: each row has its own write position (model/cache.py).
A call is as wide as its longest piece; a shorter piece is RIGHT-padded with segment id 0,
and its row advances only by its own tokens, so the pad slots stay free for the row's next
call: rows never pad in lockstep, and each row's room is its own (`remaining(state)[r]`). Pad
slots are transparent to the model (attention masks them; DeltaNet neither writes nor decays
state there, and its conv window carries over calls); the DeltaNet conv is only exact when a
row's pads come after its real tokens inside one call. During decoding a row that has stopped
(or is not active) feeds a pad per step, which costs it no slot, while the others go on. A
row whose cache fills before its limit ends with `Generation.cache_full[r]`.

Every sampled token, the stop token included, is fed back into the cache before the loop
ends, so the next continuation (a tool observation) follows it directly: the history is never
re-rendered or re-tokenised. `state.tokens` records the token written at each slot, so the
rollout can check its own record against what the model actually saw (`contexts`).

A prefill whose rows repeat a piece computes it once and copies the cache into those rows
(`share_prefills`). Long pieces are fed `prefill_chunk` tokens per call, and attention in the cache path visits
only the buffer's written slots (model/attention.py::cache_attention), so neither a prefill's
memory nor a decode step's time grows with `max_length`.

Compilation: `extend` pads its width up to a bucket (`bucket_length`: at most 4 widths per
octave, at most 25% padding), so prompts and observations of any length reuse a few compiled
shapes; `generate` compiles once
per (batch, max_new_tokens, SamplingParams) and runs a `lax.while_loop` that stops as soon as
every row is done. Logits come from `model.logits` on the model's hidden states, the same
code the trainer's full forward uses, and log-probs from `sampling.token_logprobs` math.

Sharded sampling (`mesh=`): the state's rows go over the data-parallel axes and the cache's K/V
heads and DeltaNet channels over `tensor`, by the logical-axis rules (model/cache.py
`cache_axes`, parallel/rules.py); every call is traced under the mesh and constrains the state
it returns to that layout, so no device holds the whole cache. `param_dtype=` keeps the
sampler's own copy of the weights in the inference dtype (bf16 on the 9B presets: half the
bytes each decode step reads); `update_params` casts each new version once.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from reterm_jax.model.cache import Cache, cache_axes, init_cache, write_slots
from reterm_jax.model.stacked import is_stacked, unstack_params
from reterm_jax.parallel.rules import logical_to_sharding
from reterm_jax.rl.inference.sampling import SamplingParams, sampling_logprobs

ROW_SEGMENT = 1  # each row holds one sequence; 0 marks padding


@struct.dataclass
class SamplerState:
    cache: Cache
    tokens: jax.Array       # int32 [B, L]: token written at each cache slot (pad where segment 0)
    last_logits: jax.Array  # fp32 [B, V]: logits that predict each row's next token

    @property
    def index(self) -> np.ndarray:
        """int [B]: slots each row has written."""
        return np.asarray(self.cache.index)


@dataclasses.dataclass(frozen=True)
class Generation:
    """One `generate` call, per row (empty lists for rows that did not run)."""
    tokens: list[list[int]]
    logprobs: list[list[float]]
    stopped: list[bool]      # ended on a stop token (False: hit its length limit or did not run)
    steps: int               # decode steps the loop ran (the longest row's tokens)
    cache_full: list[bool]   # ran out of cache slots before its stop token and before its limit


def _is_axes(x) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def state_shardings(state: SamplerState, mesh, rules=None) -> SamplerState:
    """A NamedSharding per leaf of `state` (concrete or jax.eval_shape'd), from the logical axes:
    rows over the data-parallel axes, K/V heads and DeltaNet channels over tensor."""
    axes = SamplerState(cache=cache_axes(state.cache), tokens=("batch", None), last_logits=("batch", "vocab"))
    leaves, treedef = jax.tree.flatten(state)
    names = jax.tree.leaves(axes, is_leaf=_is_axes)
    return treedef.unflatten([logical_to_sharding(n, mesh, rules, shape=x.shape) for n, x in zip(names, leaves)])


def cast_params(params, dtype):
    """`params` with floating leaves in `dtype` (new buffers); None: unchanged."""
    if dtype is None:
        return params
    dtype = jnp.dtype(dtype)

    def one(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        if isinstance(x, jax.ShapeDtypeStruct):  # abstract params (AOT planning)
            return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
        return x.astype(dtype)
    return jax.tree.map(one, params)


@partial(jax.jit, static_argnames="dtype")
def _inference_copy(params, dtype):
    return unstack_params(cast_params(params, dtype))


def inference_params(params, dtype):
    """The samplers' copy of a causal LM's params: floating leaves in `dtype` (None: as they
    are) and in the per-layer layout (a stacked trainer's blocks sliced into layers in the same
    jit, so only the result is allocated). New buffers when anything changes."""
    if not is_stacked(params):
        return cast_params(params, dtype)
    if isinstance(params, nnx.State):
        params = nnx.to_pure_dict(params)
    return _inference_copy(params, None if dtype is None else jnp.dtype(dtype))


def weight_shardings(graphdef: nnx.GraphDef, params, mesh, layout: str = "tensor", rules=None):
    """Where the samplers' weights go for `rollout.weights_sharding=layout` (parallel/rules.py
    SAMPLER_WEIGHTS): a NamedSharding per leaf of `params` (the published copy's pure dict, per
    layer, concrete or abstract), from the logical names of `graphdef`'s params."""
    from reterm_jax.parallel.rules import sampler_weight_rules, state_shardings
    model = nnx.merge(graphdef, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params))
    return nnx.to_pure_dict(state_shardings(nnx.state(model), mesh, sampler_weight_rules(layout, rules)))


# Tokens per model call when `extend` appends a long piece (a prefill of the failed history).
PREFILL_CHUNK = 4096


def bucket_length(n: int, min_bucket: int = 16) -> int:
    """The padded width for n tokens: n rounded up to a quarter of its power of two (at least
    `min_bucket`), so at most 4 compiled widths per octave and at most 25% padding."""
    if n <= min_bucket:
        return min_bucket
    step = max(min_bucket, 1 << max(0, (n - 1).bit_length() - 3))
    return -(-n // step) * step


# rollout.kv_cache_dtype: the K/V storage the samplers may use ("" = their compute dtype)
KV_CACHE_DTYPES = ("", "float32", "bfloat16", "float16", "float8_e4m3fn")


class Sampler:
    def __init__(self, model: nnx.Module, *, stop_ids: Sequence[int], pad_id: int, max_length: int,
                 min_bucket: int = 16, cache_dtype=None, donate: bool | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, share_prefills: bool = True, mesh=None, rules=None,
                 param_dtype=None, kv_cache_dtype=None):
        """donate: let XLA reuse the cache buffers of the state passed to `extend` / `generate`
        (that state is then invalid: always continue from the returned one). Default: on
        accelerators only (the CPU backend cannot donate). False keeps old states usable, e.g.
        to decode several times from one prefill.
        prefill_chunk: `extend` feeds at most this many tokens per model call (longer pieces go in
        consecutive calls of this width), so a prefill's activations are those of one chunk
        whatever the prompt's length; 0 = one call.
        share_prefills: a prefill (the first `extend` of a fresh state) whose rows repeat the same
        piece computes each distinct piece once and copies its cache into the rows that share it
        (a GRPO group's G attempts share their failed history): the model-side twin of the
        sandbox's snapshot/branch. False prefills every row.
        mesh / rules: shard the state over this mesh by the logical-axis rules (default
        parallel/rules.py LOGICAL_RULES); None: wherever the inputs are (one device).
        param_dtype: the dtype of the sampler's weights (e.g. jnp.bfloat16); None: the model's.
        kv_cache_dtype: the dtype the attention layers' K/V are stored in (e.g. float8_e4m3fn: half
        the cache of bf16, each K/V value rounded to it; model/cache.py); None: `cache_dtype`."""
        self.config = model.config
        graphdef, params = nnx.split(model)
        # Decoding keeps no activations for a backward pass, so remat only costs time; and the
        # remat'd layer cannot update the cache inside generate's while_loop. The sampler runs
        # its own copy of the module structure with remat off (the caller's model is untouched).
        # A stacked model (scan_layers) is sampled per layer: slicing the stacked weights inside the
        # decode loop would copy them every step.
        copy = nnx.merge(graphdef, params)
        copy.model.remat = False
        copy.model.set_scan_layers(False)
        self.graphdef, params = nnx.split(copy)
        self.param_dtype = None if param_dtype is None else jnp.dtype(param_dtype)
        self.params = cast_params(params, self.param_dtype)
        self.mesh, self.rules = mesh, rules
        self.stop_ids = tuple(int(s) for s in stop_ids)
        self.pad_id = int(pad_id)
        self.max_length = int(max_length)
        self.min_bucket = min_bucket
        self.prefill_chunk = int(prefill_chunk)
        self.share_prefills = bool(share_prefills)
        self.cache_dtype = cache_dtype if cache_dtype is not None else model.model.dtype
        self.kv_cache_dtype = None if kv_cache_dtype is None else jnp.dtype(kv_cache_dtype)
        if donate is None:
            donate = jax.default_backend() != "cpu"
        donated = (1,) if donate else ()  # argument 1 is the SamplerState
        constrain = partial(_constrain, mesh, rules)
        self._inits: dict[int, object] = {}
        self._take_rows = jax.jit(partial(_take_rows, constrain))
        self._put_rows = jax.jit(partial(_put_rows, constrain), donate_argnums=(0,) if donate else ())
        self._extend = jax.jit(partial(_extend, self.graphdef, constrain), donate_argnums=donated)
        self._generate = jax.jit(partial(_generate, self.graphdef, self.stop_ids, self.pad_id, constrain),
                                 static_argnames=("params", "width"), donate_argnums=donated)

    def update_params(self, model: nnx.Module) -> None:
        """Take the current weights (after a training step); shapes must not change. A stacked
        model's weights are taken per layer (inference_params)."""
        state = nnx.state(model)
        self.params = (self.as_params(inference_params(state, self.param_dtype)) if is_stacked(state)
                       else cast_params(state, self.param_dtype))

    def as_params(self, params) -> nnx.State:
        """`params` as a State like `self.params`: an nnx.State of this sampler's structure as is,
        or a pure dict (the trainer's; a stacked one is sliced into layers first, a copy)."""
        if isinstance(params, nnx.State) and not is_stacked(params):
            return params
        if is_stacked(params):
            params = inference_params(params, None)
        state = jax.tree.map(lambda x: x, self.params)  # a new State over the same leaves
        nnx.replace_by_pure_dict(state, params)
        return state

    def _traced(self):
        """The mesh context calls trace under (the decoder's row constraints read it)."""
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def _fresh(self, batch_size: int) -> SamplerState:
        cache = init_cache(self.config, batch_size, self.max_length, self.cache_dtype, self.kv_cache_dtype)
        return SamplerState(cache=cache, tokens=jnp.full((batch_size, self.max_length), self.pad_id, jnp.int32),
                            last_logits=jnp.zeros((batch_size, self.config.vocab_size), jnp.float32))

    def init(self, batch_size: int) -> SamplerState:
        if self.mesh is None:
            return self._fresh(batch_size)
        # allocated in place on each device (never a whole cache on one device first)
        if batch_size not in self._inits:
            shardings = state_shardings(jax.eval_shape(partial(self._fresh, batch_size)), self.mesh, self.rules)
            self._inits[batch_size] = jax.jit(partial(self._fresh, batch_size), out_shardings=shardings)
        return self._inits[batch_size]()

    def put_rows(self, state: SamplerState, rows: Sequence[int], source: SamplerState) -> SamplerState:
        """`state` with row rows[i] replaced by row i of `source` (whole rows: cache layers, write
        position, tokens, logits), e.g. a slot of a continuous batch taking an episode prefilled
        in a small state of its own. Same max_length; one compiled shape per source batch."""
        if len(rows) != source.tokens.shape[0]:
            raise ValueError(f"put_rows: {len(rows)} rows for a source of {source.tokens.shape[0]}")
        with self._traced():
            return self._put_rows(state, jnp.asarray(rows, jnp.int32), source)

    def remaining(self, state: SamplerState) -> np.ndarray:
        """int [B]: cache slots still free in each row."""
        return self.max_length - state.index

    def extend(self, state: SamplerState, pieces: Sequence[Sequence[int] | None]) -> SamplerState:
        """Append pieces[r] to row r (None or empty: the row gets only pad slots). Right-padded to
        a bucket. The first call on a fresh state is the prefill."""
        batch = state.tokens.shape[0]
        if len(pieces) != batch:
            raise ValueError(f"extend: {len(pieces)} pieces for a batch of {batch}")
        longest = max((len(p) for p in pieces if p), default=0)
        if longest == 0:
            return state
        room = self.remaining(state)
        for r, p in enumerate(pieces):
            if p and len(p) > room[r]:
                raise self._no_room(state, r, len(p))
        if self.share_prefills and not state.index.any():  # fresh: every row's cache is the same (empty)
            distinct = list(dict.fromkeys(tuple(p) if p else () for p in pieces))
            if len(distinct) < batch:
                rows = [distinct.index(tuple(p) if p else ()) for p in pieces]
                shared = self.extend(self.init(len(distinct)), [list(p) or None for p in distinct])
                with self._traced():
                    return self._take_rows(shared, jnp.asarray(rows, jnp.int32))
        chunk = self.prefill_chunk
        if 0 < chunk < longest:
            # Each row's tokens stay contiguous: a row shorter than a chunk is padded after its
            # last real token and gets only pad slots in the later chunks (transparent, module doc).
            for start in range(0, longest - chunk, chunk):
                state = self._extend_call(state, [p[start:start + chunk] if p else None for p in pieces], chunk)
            start = (longest - 1) // chunk * chunk
            pieces = [p[start:] if p and len(p) > start else None for p in pieces]
            longest = longest - start
        # Pad slots past the buffer's end are dropped (model/cache.py), so the bucket may overhang it.
        return self._extend_call(state, pieces, bucket_length(longest, self.min_bucket))

    def _no_room(self, state: SamplerState, row: int, tokens: int) -> ValueError:
        return ValueError(f"extend: {tokens} tokens do not fit in row {row}'s cache ({self.remaining(state)[row]} "
                          f"of {self.max_length} slots free); raise max_length")

    def _extend_call(self, state: SamplerState, pieces, width: int) -> SamplerState:
        """One model call appending pieces[r] (at most `width` tokens) to row r, right-padded."""
        batch = state.tokens.shape[0]
        ids = np.full((batch, width), self.pad_id, np.int32)
        seg = np.zeros((batch, width), np.int32)
        for r, piece in enumerate(pieces):
            if piece:
                ids[r, :len(piece)] = piece
                seg[r, :len(piece)] = ROW_SEGMENT
        with self._traced():
            return self._extend(self.params, state, jnp.asarray(ids), jnp.asarray(seg))

    def generate(self, state: SamplerState, key: jax.Array, params: SamplingParams, max_new_tokens: int,
                 *, active: Sequence[bool] | None = None, row_limits: Sequence[int] | None = None,
                 forced: Sequence[Sequence[int] | None] | None = None,
                 offsets: Sequence[int] | None = None) -> tuple[SamplerState, Generation]:
        """Decode up to `max_new_tokens` per row until a stop token. active[r] False: row r feeds
        pads only. row_limits[r]: a smaller per-row cap. forced[r]: teacher-force these tokens
        for row r instead of sampling (its log-probs are still the sampler's); the row stops
        after them or at a stop token among them. Each row also stops when its own cache is full
        (`Generation.cache_full`).

        Randomness is per row: `key` is one key (row r then uses fold_in(key, r)) or one key per
        row ([B] typed keys, e.g. one per episode), and the i-th token this call samples for row
        r draws from fold_in(row key, offsets[r] + i) (offsets default 0). A row's tokens thus
        depend only on its key, its token count and its logits, never on its batch, its slot or
        when the other rows stop: rollout engines that schedule rows differently sample the same
        episodes."""
        batch = state.tokens.shape[0]
        room = self.remaining(state)
        active, wanted, forced_ids, has_forced = self._generate_args(batch, max_new_tokens, active, row_limits, forced)
        limits = np.minimum(wanted, room).astype(np.int32)  # each row also stops when its own cache is full
        args = tuple(jnp.asarray(x) for x in (active, limits, forced_ids, has_forced))
        keys = row_keys(key, batch)
        start = jnp.asarray(np.zeros(batch, np.int32) if offsets is None else np.asarray(offsets, np.int32))
        with self._traced():
            state, out, logp, length, stopped, steps = self._generate(
                self.params, state, keys, start, *args, params=params, width=max_new_tokens)
        out, logp, length, stopped = (np.asarray(x) for x in (out, logp, length, stopped))
        return state, Generation(
            tokens=[out[r, :length[r]].tolist() for r in range(batch)],
            logprobs=[logp[r, :length[r]].tolist() for r in range(batch)],
            stopped=[bool(s) for s in stopped], steps=int(steps),
            cache_full=[bool(not stopped[r] and length[r] >= room[r] and room[r] < wanted[r]) for r in range(batch)])

    def _generate_args(self, batch: int, max_new_tokens: int, active, row_limits, forced):
        """(active, limits, forced ids, has_forced) as host arrays: what each row asks for (the
        cache's room is applied by `generate`)."""
        active = np.ones(batch, bool) if active is None else np.asarray(active, bool)
        limits = np.full(batch, max_new_tokens, np.int32)
        if row_limits is not None:
            limits = np.minimum(limits, np.asarray(row_limits, np.int32))
        forced_ids = np.full((batch, max_new_tokens), self.pad_id, np.int32)
        has_forced = np.zeros(batch, bool)
        for r, f in enumerate(forced or ()):
            if f is not None:
                if len(f) > max_new_tokens:
                    raise ValueError(f"forced tokens for row {r}: {len(f)} > max_new_tokens={max_new_tokens}")
                forced_ids[r, :len(f)] = f
                has_forced[r] = True
                limits[r] = min(limits[r], len(f))
        return active, limits, forced_ids, has_forced

    def lower_generate(self, state: SamplerState, params: SamplingParams, max_new_tokens: int):
        """`generate`'s jitted loop lowered for `state` (concrete, or jax.ShapeDtypeStruct leaves
        with shardings, e.g. for AOT memory analysis on fake devices): `.compile()` it to read
        its memory_analysis() or its HLO's collectives."""
        batch = state.tokens.shape[0]
        args = tuple(jnp.asarray(x) for x in self._generate_args(batch, max_new_tokens, None, None, None))
        with self._traced():
            return self._generate.lower(self.params, state, row_keys(jax.random.key(0), batch),
                                        jnp.zeros((batch,), jnp.int32), *args, params=params, width=max_new_tokens)

    def lower_extend(self, state: SamplerState, width: int):
        """`extend`'s model call for a `width`-token piece per row, lowered (as lower_generate)."""
        batch = state.tokens.shape[0]
        ids = jax.ShapeDtypeStruct((batch, width), jnp.int32)
        with self._traced():
            return self._extend.lower(self.params, state, ids, ids)

    def contexts(self, state: SamplerState) -> list[np.ndarray]:
        """Per row, the tokens in its cache slots (padding dropped), in order."""
        tokens, seg = np.asarray(state.tokens), np.asarray(state.cache.segment_ids)
        return [tokens[r][seg[r] != 0] for r in range(tokens.shape[0])]

    def context(self, state: SamplerState, row: int) -> np.ndarray:
        """`contexts(state)[row]`, reading only that row from the device."""
        tokens, seg = np.asarray(state.tokens[row]), np.asarray(state.cache.segment_ids[row])
        return tokens[seg != 0]


def _take_rows(constrain, state: SamplerState, rows: jax.Array) -> SamplerState:
    """The state whose row r is row rows[r] of `state`: every leaf has the batch axis first (cache
    layers, write positions, tokens, logits)."""
    return constrain(jax.tree.map(lambda x: jnp.take(x, rows, axis=0), state))


def _put_rows(constrain, state: SamplerState, rows: jax.Array, source: SamplerState) -> SamplerState:
    """`state` with rows[i] := row i of `source`, every leaf with a batch axis (the whole state)."""
    return constrain(jax.tree.map(lambda x, y: x.at[rows].set(y.astype(x.dtype)), state, source))


def _constrain(mesh, rules, state: SamplerState) -> SamplerState:
    """`state` pinned to its sharded layout (no-op without a mesh)."""
    if mesh is None:
        return state
    return jax.lax.with_sharding_constraint(state, state_shardings(state, mesh, rules))


def _forward(graphdef, params, ids, positions, segment_ids, cache):
    model = nnx.merge(graphdef, params)
    hidden, cache = model.model(ids, positions=positions, segment_ids=segment_ids, cache=cache)
    return model, hidden, cache


def _extend(graphdef, constrain, params, state: SamplerState, ids, seg) -> SamplerState:
    cache = state.cache
    width = ids.shape[1]
    positions = cache.next_position[:, None] + jnp.cumsum(seg != 0, axis=1) - 1
    positions = jnp.where(seg != 0, positions, 0)
    tokens = write_slots(state.tokens, ids, cache.index, ("batch", None))
    model, hidden, cache = _forward(graphdef, params, ids, positions, seg, cache)
    # Only each row's last real token needs logits (the full [B, T, V] is large at 248K vocab).
    last = jnp.max(jnp.where(seg != 0, jnp.arange(width), -1), axis=1)
    h_last = jnp.take_along_axis(hidden, jnp.maximum(last, 0)[:, None, None], axis=1)
    logits = model.logits(h_last)[:, 0]
    last_logits = jnp.where((last >= 0)[:, None], logits, state.last_logits)
    return constrain(SamplerState(cache=cache, tokens=tokens, last_logits=last_logits))


def row_keys(key: jax.Array, batch: int) -> jax.Array:
    """[B] typed keys: one key -> fold_in(key, r) per row; B keys (an array or a list) as given."""
    if isinstance(key, (list, tuple)):
        key = jnp.stack(list(key))
    if key.ndim == 0:
        return jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(batch))
    if key.shape != (batch,):
        raise ValueError(f"generate: {key.shape[0]} row keys for a batch of {batch}")
    return key


def _generate(graphdef, stop_ids, pad_id, constrain, params_tree, state: SamplerState, keys, start, active, limits,
              forced, has_forced, *, params: SamplingParams, width: int):
    batch = active.shape[0]
    stop = jnp.asarray(stop_ids, jnp.int32)

    def cond(carry):
        step, done = carry[0], carry[-1]
        return (step < width) & ~jnp.all(done)  # limits <= width and the cache's room: done covers both

    def body(carry):
        step, st, out, out_logp, length, stopped, done = carry
        logp_all = sampling_logprobs(st.last_logits, params)
        if params.greedy:
            drawn = jnp.argmax(logp_all, axis=-1).astype(jnp.int32)
        else:  # row r's i-th token of the call: fold_in(its key, start[r] + i)
            subs = jax.vmap(jax.random.fold_in)(keys, start + length)
            drawn = jax.vmap(lambda k, lp: jax.random.categorical(k, lp))(subs, logp_all).astype(jnp.int32)
        tok = jnp.where(has_forced, forced[:, jnp.minimum(step, width - 1)], drawn)
        lp = jnp.take_along_axis(logp_all, tok[:, None], axis=-1)[:, 0]
        running = ~done
        tok = jnp.where(running, tok, pad_id)
        out = out.at[:, step].set(tok)
        out_logp = out_logp.at[:, step].set(jnp.where(running, lp, 0.0))
        length = length + running.astype(jnp.int32)
        hit_stop = running & jnp.isin(tok, stop)
        # Feed the token (stop tokens too) so the cache ends exactly after the sampled text.
        seg = jnp.where(running, ROW_SEGMENT, 0)[:, None].astype(jnp.int32)
        pos = jnp.where(running, st.cache.next_position, 0)[:, None]
        tokens = write_slots(st.tokens, tok[:, None], st.cache.index, ("batch", None))
        model, hidden, cache = _forward(graphdef, params_tree, tok[:, None], pos, seg, st.cache)
        logits = model.logits(hidden)[:, 0]
        st = constrain(SamplerState(cache=cache, tokens=tokens,
                                    last_logits=jnp.where(running[:, None], logits, st.last_logits)))
        done = done | hit_stop | (length >= limits)
        return step + 1, st, out, out_logp, length, stopped | hit_stop, done

    init = (jnp.zeros((), jnp.int32), constrain(state), jnp.full((batch, width), pad_id, jnp.int32),
            jnp.zeros((batch, width), jnp.float32), jnp.zeros((batch,), jnp.int32),
            jnp.zeros((batch,), bool), ~active | (limits <= 0))
    step, state, out, out_logp, length, stopped, _ = jax.lax.while_loop(cond, body, init)
    return state, out, out_logp, length, stopped, step
