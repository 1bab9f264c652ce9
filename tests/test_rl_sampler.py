"""The cached, batched sampler against the model's full forward (the trainer's code path)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from reterm_jax.model import Qwen3_5Config, Qwen3_5ForCausalLM
from reterm_jax.rl.inference.sampler import Sampler, bucket_length
from reterm_jax.rl.inference.sampling import SamplingParams, token_logprobs

PAD, STOP = 0, (1,)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]


@pytest.fixture(scope="module")
def model():
    cfg = Qwen3_5Config.tiny()
    model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(3))
    # Norm weights start at 0 (1+w form): perturb them so every weight shapes the logits.
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if "norm" in "/".join(map(str, path)):
            var[...] = var[...] + 0.1 * jax.random.normal(jax.random.key(len(path)), var.shape)
    return model


@pytest.fixture(scope="module")
def full_forward(model):
    """Right-padded full forward of token lists -> per row fp32 logits [len, V]."""
    fwd = nnx.jit(lambda m, ids, seg: m(ids, segment_ids=seg))

    def run(rows):
        width = bucket_length(max(len(r) for r in rows), 64)
        ids = np.zeros((len(rows), width), np.int32)
        seg = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            ids[i, :len(r)], seg[i, :len(r)] = r, 1
        logits = np.asarray(fwd(model, jnp.asarray(ids), jnp.asarray(seg)))
        return [logits[i, :len(r)] for i, r in enumerate(rows)]
    return run


def make_sampler(model, max_length=256, stop=STOP):
    # donate=False: some tests decode twice from one state (donation is an accelerator-only
    # buffer reuse; the results do not depend on it).
    return Sampler(model, stop_ids=stop, pad_id=PAD, max_length=max_length, donate=False)


@pytest.fixture(scope="module")
def sampler(model):
    """Shared, so its compiled shapes are reused across tests (states are per test)."""
    return make_sampler(model)


def test_greedy_equals_full_forward_argmax_over_two_turns(sampler, full_forward):
    state = sampler.extend(sampler.init(3), PROMPTS)
    state, gen = sampler.generate(state, jax.random.key(0), SamplingParams(0.0), 12, row_limits=[12, 5, 9])
    assert [len(t) for t in gen.tokens] == [12, 5, 9] and gen.stopped == [False] * 3
    # A continuation (row 1 gets nothing) and a second turn on the same cache.
    extra = [[40, 41, 42], None, [43]]
    state = sampler.extend(state, extra)
    state, gen2 = sampler.generate(state, jax.random.key(1), SamplingParams(0.0), 8)
    contexts = sampler.contexts(state)
    for r in range(3):
        expected = PROMPTS[r] + gen.tokens[r] + (extra[r] or []) + gen2.tokens[r]
        assert contexts[r].tolist() == expected
    # Per-row write positions: each row's written slots are exactly its context (no lockstep pads).
    np.testing.assert_array_equal(state.index, [len(c) for c in contexts])
    for r, logits in enumerate(full_forward([c.tolist() for c in contexts])):
        ctx = contexts[r]
        start1 = len(PROMPTS[r])
        start2 = start1 + len(gen.tokens[r]) + len(extra[r] or [])
        for start, toks in ((start1, gen.tokens[r]), (start2, gen2.tokens[r])):
            argmax = logits[start - 1:start - 1 + len(toks)].argmax(-1)
            np.testing.assert_array_equal(argmax, toks)
            np.testing.assert_array_equal(ctx[start:start + len(toks)], toks)


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=40, top_p=0.9)])
def test_sampler_logprobs_equal_full_forward_logprobs(sampler, full_forward, params):
    state = sampler.extend(sampler.init(3), PROMPTS)
    state, gen = sampler.generate(state, jax.random.key(7), params, 16)
    extra = [[50, 51], [52, 53, 54, 55], None]
    state = sampler.extend(state, extra)
    state, gen2 = sampler.generate(state, jax.random.key(8), params, 16)
    contexts = sampler.contexts(state)
    for r, logits in enumerate(full_forward([c.tolist() for c in contexts])):
        ctx = contexts[r]
        starts = (len(PROMPTS[r]), len(PROMPTS[r]) + len(gen.tokens[r]) + len(extra[r] or []))
        for g, start in zip((gen, gen2), starts):
            n = len(g.tokens[r])
            assert ctx[start:start + n].tolist() == g.tokens[r]
            ref = token_logprobs(jnp.asarray(logits[start - 1:start - 1 + n]), jnp.asarray(ctx[start:start + n]),
                                 params)
            np.testing.assert_allclose(g.logprobs[r], np.asarray(ref), rtol=0, atol=1e-4)
            assert np.isfinite(g.logprobs[r]).all()


def test_stop_tokens_per_row_lengths_and_inactive_rows(model):
    sampler = make_sampler(model, stop=())
    base = sampler.extend(sampler.init(3), PROMPTS)
    _, free = sampler.generate(base, jax.random.key(0), SamplingParams(0.0), 10)
    stop_tok = free.tokens[0][3]
    sampler = make_sampler(model, stop=(stop_tok, 999))
    state, gen = sampler.generate(sampler.extend(sampler.init(3), PROMPTS), jax.random.key(0), SamplingParams(0.0),
                                  10, active=[True, True, False], row_limits=[10, 4, 10])
    first = free.tokens[0].index(stop_tok)
    assert gen.tokens[0] == free.tokens[0][:first + 1] and gen.stopped[0]
    row1 = free.tokens[1][:4]
    cut = row1.index(stop_tok) + 1 if stop_tok in row1 else 4
    assert gen.tokens[1] == row1[:cut] and gen.stopped[1] == (stop_tok in row1)
    assert gen.tokens[2] == [] and not gen.stopped[2]
    assert gen.steps == max(len(t) for t in gen.tokens)  # the loop exits once every row is done
    contexts = sampler.contexts(state)
    assert contexts[2].tolist() == PROMPTS[2]  # an inactive row's cache only gained pad slots
    assert contexts[0].tolist() == PROMPTS[0] + gen.tokens[0]  # the stop token is in the cache


def test_forced_tokens_go_through_the_same_path(sampler, full_forward):
    forced = [[60, 61, 62, 1, 63], None, [64, 65]]
    state, gen = sampler.generate(sampler.extend(sampler.init(3), PROMPTS), jax.random.key(0),
                                  SamplingParams(1.0), 8, forced=forced)
    assert gen.tokens[0] == [60, 61, 62, 1] and gen.stopped[0]  # stops at the forced stop token
    assert gen.tokens[2] == [64, 65] and not gen.stopped[2]
    assert len(gen.tokens[1]) == 8
    contexts = sampler.contexts(state)
    logits = full_forward([c.tolist() for c in contexts])
    for r in (0, 2):
        n, p = len(gen.tokens[r]), len(PROMPTS[r])
        ref = token_logprobs(jnp.asarray(logits[r][p - 1:p - 1 + n]), jnp.asarray(gen.tokens[r]), SamplingParams(1.0))
        np.testing.assert_allclose(gen.logprobs[r], np.asarray(ref), atol=1e-4)


def test_cache_capacity_is_per_row(model, full_forward):
    """Each row's room is its own: a long row fills its cache (cache_full) while a short row in
    the same batch keeps decoding to its own limit, and a piece that does not fit is refused."""
    sampler = make_sampler(model, max_length=40, stop=())
    # 35 and 3 tokens: the call is 48 wide (bucket), its pad slots past 40 are dropped
    state = sampler.extend(sampler.init(2), [list(range(2, 37)), [5, 6, 7]])
    assert state.index.tolist() == [35, 3]
    state, gen = sampler.generate(state, jax.random.key(0), SamplingParams(0.0), 32, row_limits=[32, 20])
    assert [len(t) for t in gen.tokens] == [5, 20]  # row 0 capped by its free slots, row 1 by its limit
    assert gen.cache_full == [True, False] and gen.stopped == [False, False]
    assert state.index.tolist() == [40, 23]
    contexts = sampler.contexts(state)
    for r, logits in enumerate(full_forward([c.tolist() for c in contexts])):
        start = len(contexts[r]) - len(gen.tokens[r])
        np.testing.assert_array_equal(logits[start - 1:-1].argmax(-1), gen.tokens[r])
    with pytest.raises(ValueError, match="row 0's cache"):
        sampler.extend(state, [[5], None])
    state = sampler.extend(state, [None, list(range(2, 19))])  # row 1 still has 17 slots
    assert state.index.tolist() == [40, 40]


def test_bucket_length_bounds_padding():
    for n in range(1, 5000, 7):
        b = bucket_length(n)
        assert n <= b <= max(int(n * 1.25) + 1, -(-n // 16) * 16)
    assert len({bucket_length(n) for n in range(1025, 2049)}) == 4


def test_a_remat_model_samples_like_the_plain_one_and_keeps_its_remat(model, sampler):
    """Training models run with remat; the sampler decodes them without it (the remat'd layer
    cannot update the cache inside the decode loop) and leaves the caller's module as it was."""
    graphdef, params = nnx.split(model)
    trained = nnx.merge(graphdef, params)
    trained.model.remat = True
    remat_sampler = make_sampler(trained)
    assert trained.model.remat is True
    outs = []
    for s in (sampler, remat_sampler):
        state = s.extend(s.init(len(PROMPTS)), PROMPTS)
        _, gen = s.generate(state, jax.random.key(0), SamplingParams(0.0), 6)
        outs.append(gen.tokens)
    assert outs[0] == outs[1]


def test_chunked_prefill_equals_one_call_and_the_full_forward(model, sampler, full_forward):
    """Prompts fed 5 tokens per call (rows of 7, 2 and 17 tokens: some rows run out of tokens
    mid-way and get pad slots), a continuation longer than a chunk, then greedy decoding: the
    same logits (1e-4) and tokens as one call, and as the full forward."""
    chunked = Sampler(model, stop_ids=STOP, pad_id=PAD, max_length=256, donate=False, prefill_chunk=5)
    one = sampler.extend(sampler.init(3), PROMPTS)
    many = chunked.extend(chunked.init(3), PROMPTS)
    np.testing.assert_allclose(np.asarray(many.last_logits), np.asarray(one.last_logits), atol=1e-4, rtol=1e-4)
    for r, logits in enumerate(full_forward(PROMPTS)):
        np.testing.assert_allclose(np.asarray(many.last_logits[r]), logits[-1], atol=1e-4, rtol=1e-4)
    extra = [list(range(40, 52)), None, [43]]
    outs = []
    for s, state in ((sampler, one), (chunked, many)):
        state, gen = s.generate(s.extend(state, extra), jax.random.key(0), SamplingParams(0.0), 10)
        outs.append((gen.tokens, [c.tolist() for c in s.contexts(state)]))
    assert outs[0][0] == outs[1][0]
    assert outs[1][1] == [PROMPTS[r] + (extra[r] or []) + outs[1][0][r] for r in range(3)]


def test_a_shared_prefill_is_computed_once_and_branches_like_separate_prefills(model):
    """Rows 0, 2 and 3 share a prompt (one prefill, its cache copied), row 1 has its own: the same
    logits, sampled tokens and log-probs as prefilling every row; later calls are per row."""
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[2], PROMPTS[2]]
    results = []
    for share in (True, False):
        s = Sampler(model, stop_ids=STOP, pad_id=PAD, max_length=256, donate=False, share_prefills=share)
        calls = []
        s._extend = (lambda fn: lambda params, st, ids, seg: calls.append(ids.shape) or fn(params, st, ids, seg))(s._extend)
        state = s.extend(s.init(4), prompts)
        state, gen = s.generate(state, jax.random.key(5), SamplingParams(1.0), 8)
        results.append((np.asarray(state.last_logits), gen.tokens, gen.logprobs, calls))
    (logits_a, tokens_a, logp_a, calls_a), (logits_b, tokens_b, logp_b, calls_b) = results
    assert [c[0] for c in calls_a] == [2] and [c[0] for c in calls_b] == [4]  # 2 distinct prompts vs 4 rows
    np.testing.assert_allclose(logits_a, logits_b, atol=1e-5, rtol=1e-5)
    assert tokens_a == tokens_b
    np.testing.assert_allclose(np.concatenate(logp_a), np.concatenate(logp_b), atol=1e-5)
    assert len({tuple(t) for t in (tokens_a[0], tokens_a[2], tokens_a[3])}) > 1  # the branches sample apart


def test_a_rows_samples_depend_on_its_key_and_count_only(sampler):
    """Row keys: the same row key and offset give the same tokens alone or in a batch, at any
    position in it, and continuing with offsets equals one longer call."""
    keys = jax.random.split(jax.random.key(11), 3)
    params = SamplingParams(1.0)
    _, batch = sampler.generate(sampler.extend(sampler.init(3), PROMPTS), keys, params, 12)
    _, alone = sampler.generate(sampler.extend(sampler.init(1), [PROMPTS[2]]), keys[2:], params, 12)
    assert alone.tokens[0] == batch.tokens[2]
    flipped = [PROMPTS[2], PROMPTS[0]]
    _, other = sampler.generate(sampler.extend(sampler.init(2), flipped), jnp.stack([keys[2], keys[0]]), params, 12)
    assert other.tokens == [batch.tokens[2], batch.tokens[0]]
    state, first = sampler.generate(sampler.extend(sampler.init(1), [PROMPTS[0]]), keys[:1], params, 5)
    _, rest = sampler.generate(state, keys[:1], params, 7, offsets=[5])
    assert first.tokens[0] + rest.tokens[0] == batch.tokens[0]


def test_a_stacked_model_samples_per_layer_like_the_per_layer_one():
    """A scan_layers model (params stacked by block, model/stacked.py) is sampled in the per-layer
    layout: same greedy tokens as the same weights per layer, at construction and after
    update_params; the caller's model stays stacked."""
    cfg = Qwen3_5Config.tiny(num_hidden_layers=4, layer_types=("linear_attention", "full_attention") * 2)
    plain = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(4))
    stacked = Qwen3_5ForCausalLM(cfg, scan_layers=True, rngs=nnx.Rngs(4))  # same seed, same weights
    samplers = [make_sampler(plain, max_length=64), make_sampler(stacked, max_length=64)]
    assert stacked.model.scan_layers and not samplers[1].graphdef == nnx.graphdef(stacked)

    def greedy(s):
        state = s.extend(s.init(2), PROMPTS[:2])
        return s.generate(state, jax.random.key(0), SamplingParams(0.0), 5)[1].tokens
    assert greedy(samplers[1]) == greedy(samplers[0])
    # a new version from the stacked trainer: scaled weights, published per layer
    scale = lambda m: nnx.update(m, jax.tree.map(lambda x: x * 1.25, nnx.state(m, nnx.Param)))
    scale(plain), scale(stacked)
    for s, m in zip(samplers, (plain, stacked)):
        s.update_params(m)
    for a, b in zip(jax.tree.leaves(samplers[0].params), jax.tree.leaves(samplers[1].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert greedy(samplers[1]) == greedy(samplers[0])
