"""Packing and the Grain pipeline: segment layout, overlong policy, checkpointing, host sharding."""
import collections
import json

import numpy as np
import pytest

from reterm_jax.data import encode_example, load_tokenizer
from reterm_jax.data.packing import check_packed, fit_length, packing_efficiency, shift_targets
from reterm_jax.data.pipeline import sft_dataset


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def make_row(i):
    """Rows of varied lengths (roughly 60-400 tiny-tokenizer tokens), each with unique content."""
    msgs = [{"role": "user", "content": f"task number {i}"}]
    for j in range(1 + i % 5):
        msgs.append({"role": "assistant", "content": f"step {j}",
                     "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "echo " + "ab" * (i * 7 % 40)}}}]})
        msgs.append({"role": "tool", "content": "output line\n" * (i % 9)})
    msgs.append({"role": "assistant", "content": f"done {i}"})
    return {"id": f"row{i}", "messages": msgs, "train_from_message_index": len(msgs) - 3}


ROWS = [make_row(i) for i in range(48)]


def segments(batches):
    """Every packed example as (tokens tuple, loss_mask tuple), in order of appearance."""
    out = []
    for b in batches:
        for tokens, seg, mask in zip(b["tokens"], b["segment_ids"], b["loss_mask"]):
            for s in range(1, int(seg.max()) + 1):
                out.append((tuple(tokens[seg == s].tolist()), tuple(mask[seg == s].tolist())))
    return out


def test_shift_targets_by_hand():
    tokens = np.array([[5, 6, 7, 8, 9, 0]])
    seg = np.array([[1, 1, 1, 2, 2, 0]])
    mask = np.array([[0, 1, 1, 0, 1, 0]], bool)
    targets, tmask = shift_targets(tokens, seg, mask)
    np.testing.assert_array_equal(targets, [[6, 7, 8, 9, 0, 0]])
    # 7 -> 8 crosses into segment 2 and 9 -> pad leaves it: neither is a target.
    np.testing.assert_array_equal(tmask, [[True, True, False, True, False, False]])
    assert packing_efficiency(seg) == pytest.approx(5 / 6)


def test_fit_length_policies():
    tokens, mask = np.arange(10, dtype=np.int32), np.array([0] * 6 + [1] * 4, bool)
    assert fit_length(tokens, mask, 10, "drop")[0] is tokens
    assert fit_length(tokens, mask, 8, "drop") is None
    t, m = fit_length(tokens, mask, 8, "truncate")
    np.testing.assert_array_equal(t, np.arange(8))
    assert m.sum() == 2
    assert fit_length(tokens, mask, 6, "truncate") is None  # no target would survive
    with pytest.raises(ValueError, match="drop"):
        fit_length(tokens, mask, 8, "cut")


def test_check_packed_catches_bad_layouts():
    good = {"tokens": np.zeros((1, 6), np.int32), "segment_ids": np.array([[1, 1, 2, 2, 2, 0]]),
            "positions": np.array([[0, 1, 0, 1, 2, 0]]), "loss_mask": np.array([[0, 1, 0, 1, 1, 0]], bool)}
    check_packed(good)
    for field, value in [("positions", [[0, 1, 2, 3, 4, 0]]), ("segment_ids", [[1, 1, 0, 2, 2, 0]]),
                         ("loss_mask", [[0, 1, 0, 1, 1, 1]]), ("segment_ids", [[2, 2, 1, 1, 1, 0]])]:
        with pytest.raises(AssertionError):
            check_packed({**good, field: np.array(value)})


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
def test_one_epoch_packs_every_fitting_example_once_unsplit(tok, overlong):
    seq_len = 256
    encoded = [encode_example(r, tok) for r in ROWS]
    ds, stats = sft_dataset(ROWS, tok, seq_len=seq_len, batch_size=2, seed=3, shard_index=0, shard_count=1,
                            overlong=overlong, drop_remainder=False)
    batches = list(ds)
    for b in batches:
        check_packed(b)
        assert b["tokens"].shape == (len(b["tokens"]), seq_len)
        t, tm = shift_targets(b["tokens"], b["segment_ids"], b["loss_mask"])
        np.testing.assert_array_equal(t, b["targets"])
        np.testing.assert_array_equal(tm, b["target_mask"])
    fits = [e for e in encoded if len(e) <= seq_len]
    long = [e for e in encoded if len(e) > seq_len]
    assert fits and long  # the rows exercise both cases
    expected = collections.Counter((tuple(e.tokens.tolist()), tuple(e.loss_mask.tolist())) for e in fits)
    if overlong == "truncate":
        expected.update((tuple(e.tokens[:seq_len].tolist()), tuple(e.loss_mask[:seq_len].tolist()))
                        for e in long if e.loss_mask[1:seq_len].any())
    # Each example appears exactly once and whole: no example is split across rows.
    assert collections.Counter(segments(batches)) == expected
    assert stats.encoded == len(ROWS)
    if overlong == "drop":
        assert (stats.dropped_overlong, stats.truncated) == (len(long), 0)
    else:
        assert stats.truncated + stats.dropped_overlong == len(long) and stats.truncated > 0
    real = sum(int(np.count_nonzero(b["segment_ids"])) for b in batches)
    assert real == sum(len(s[0]) for s in segments(batches))
    assert 0 < stats.packing_efficiency <= 1 and stats.packing_efficiency == pytest.approx(
        real / sum(b["segment_ids"].size for b in batches))


def test_epochs_are_reshuffled(tok):
    ds, _ = sft_dataset(ROWS, tok, seq_len=512, batch_size=1, seed=0, num_epochs=2, shard_index=0,
                        shard_count=1, num_packing_bins=1, drop_remainder=False)
    order = [s[0] for s in segments(list(ds))]
    first, second = order[: len(order) // 2], order[len(order) // 2:]
    assert sorted(first) == sorted(second) and first != second


def test_iterator_state_restores_exactly(tok):
    def make():
        ds, _ = sft_dataset(ROWS, tok, seq_len=256, batch_size=2, seed=11, num_epochs=None,
                            shard_index=0, shard_count=1, num_packing_bins=4)
        return iter(ds)

    it = make()
    for _ in range(5):
        next(it)
    state = it.get_state()
    state = json.loads(json.dumps(state))  # must survive a checkpoint file
    expected = [next(it) for _ in range(6)]  # runs past the end of the first epoch
    restored = make()
    restored.set_state(state)
    for want in expected:
        got = next(restored)
        assert want.keys() == got.keys()
        for k in want:
            np.testing.assert_array_equal(want[k], got[k], err_msg=k)


def test_two_hosts_see_disjoint_halves(tok):
    seen = []
    for host in range(2):
        ds, _ = sft_dataset(ROWS, tok, seq_len=1024, batch_size=2, seed=5, shard_index=host, shard_count=2,
                            drop_remainder=False)
        seen.append({s[0] for s in segments(list(ds))})
    everything = {tuple(encode_example(r, tok).tokens.tolist()) for r in ROWS}
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == everything
    assert abs(len(seen[0]) - len(seen[1])) <= 1


def test_bad_arguments_name_the_fix(tok):
    with pytest.raises(ValueError, match="overlong"):
        sft_dataset(ROWS, tok, seq_len=64, batch_size=1, overlong="cut", shard_index=0, shard_count=1)
    with pytest.raises(ValueError, match="shard_index"):
        sft_dataset(ROWS, tok, seq_len=64, batch_size=1, shard_index=2, shard_count=2)
    with pytest.raises(ValueError, match="hosts"):
        sft_dataset(ROWS[:1], tok, seq_len=64, batch_size=1, shard_index=0, shard_count=2)


def test_default_shard_is_this_jax_process(tok):
    import jax

    ds, stats = sft_dataset(ROWS[:6], tok, seq_len=1024, batch_size=1, drop_remainder=False)
    assert (jax.process_index(), jax.process_count()) == (0, 1)
    assert len(segments(list(ds))) == 6 and stats.encoded == 6


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
def test_length_report_counts_each_row_once_against_fit_length(tok, overlong, caplog):
    """The start-of-run report: its counts and lost target tokens match fit_length row by row, and
    each overlong row is named in exactly one line."""
    from reterm_jax.data.pipeline import length_report
    seq_len = 200
    with caplog.at_level("INFO", logger="reterm_jax.data.pipeline"):
        rep = length_report(ROWS, tok, seq_len=seq_len, overlong=overlong)
    kept = truncated = dropped = lost = targets = 0
    for row in ROWS:
        ex = encode_example(row, tok)
        n = int(np.count_nonzero(ex.loss_mask))
        targets += n
        fitted = fit_length(ex.tokens, ex.loss_mask, seq_len, overlong)
        if fitted is None:
            dropped, lost = dropped + 1, lost + n
        elif len(fitted[0]) < len(ex):
            truncated, lost = truncated + 1, lost + n - int(np.count_nonzero(fitted[1]))
        else:
            kept += 1
    assert (rep.rows, rep.kept, rep.truncated, rep.dropped) == (len(ROWS), kept, truncated, dropped)
    assert (rep.target_tokens, rep.target_tokens_lost) == (targets, lost) and dropped + truncated > 0
    named = collections.Counter(r.getMessage().split("'")[1] for r in caplog.records if r.getMessage().startswith("row"))
    assert len(named) == dropped + truncated and set(named.values()) == {1}
