"""The task generator (reterm_jax.tasks), without Docker: same seed same bytes, train and
held-out values from disjoint pools, every family and fault kind, valid Harbor task dirs."""
from __future__ import annotations

import filecmp
import re
import tomllib
from pathlib import Path

import pytest

from reterm_jax.sandbox import load_task
from reterm_jax.tasks.__main__ import main as cli
from reterm_jax.tasks.families import FAMILIES
from reterm_jax.tasks.generate import generate, parse_families
from reterm_jax.tasks.pools import MADE_UP_SPLITS, POOLS, SPLITS, is_novel, part, word_part

ALL = list(FAMILIES.values())
COUNT = 3 * len(ALL)  # every family with each of its three fault kinds


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _generator_meta(task_dir: Path) -> dict:
    with open(task_dir / "task.toml", "rb") as f:
        return tomllib.load(f)["metadata"]["generator"]


@pytest.fixture(scope="module")
def splits(tmp_path_factory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("generated")
    return {s: generate(ALL, s, COUNT, seed=7, out=root / s) for s in SPLITS}


def test_at_least_eight_families_with_three_fault_kinds():
    assert len(FAMILIES) >= 8
    assert len({f.make.__name__ + f.make.__module__ for f in ALL}) == len(ALL)
    for f in ALL:
        assert len(set(f.kinds)) >= 3, f.name


def test_pools_are_disjoint_and_cover_each_pool():
    for name, items in POOLS.items():
        train, heldout = set(part(name, "train")), set(part(name, "heldout"))
        assert train and heldout, name
        assert not train & heldout, name
        assert train | heldout == set(items), name


def test_same_seed_same_bytes_other_seed_other_tasks(tmp_path, splits):
    again = generate(ALL, "train", COUNT, seed=7, out=tmp_path / "again")
    assert [d.name for d in again] == [d.name for d in splits["train"]]
    for a, b in zip(again, splits["train"]):
        assert _files(a) == _files(b), a.name
        assert filecmp.cmp(a / "solution/solve.sh", b / "solution/solve.sh", shallow=False)
    other = generate(ALL, "train", COUNT, seed=8, out=tmp_path / "other")
    differ = sum(_files(a) != _files(b) for a, b in zip(other, splits["train"]))
    assert differ == COUNT


def test_every_value_comes_from_its_splits_pool(splits):
    used = {s: {} for s in SPLITS}
    for split, dirs in splits.items():
        for d in dirs:
            meta = _generator_meta(d)
            assert meta["split"] == split
            for pool, value in meta["params"].items():
                values = value if isinstance(value, list) else [value]
                if split in MADE_UP_SPLITS:  # made-up words (in no pool), train-part numbers
                    assert all(is_novel(pool, v, split) for v in values), f"{d.name}: {pool}={values} not {split}"
                else:
                    allowed = set(part(pool, split))
                    assert set(values) <= allowed, f"{d.name}: {pool}={values} not in its {split} pool"
                used[split].setdefault(pool, set()).update(values)
    for pool in used["train"]:
        assert not used["train"][pool] & used["heldout"].get(pool, set()), pool
        for split in MADE_UP_SPLITS:
            assert not used[split][pool] & used["heldout"].get(pool, set()), (split, pool)


def test_novel_words_are_made_up_shaped_like_train_items_and_seeded():
    import random

    from reterm_jax.tasks.pools import novel_word, pick
    every = {str(x) for items in POOLS.values() for x in items}
    for pool in ("host", "section", "domain", "report"):
        words = [novel_word(random.Random(i), pool) for i in range(200)]
        assert not set(words) & every, pool
        assert len(set(words)) > 150, pool  # fresh words, not a small pool in disguise
        shapes = {re.sub(r"[a-z]+", "a", w) for w in part(pool, "train")}
        assert all(re.sub(r"[a-z]+", "a", w) in shapes for w in words), pool
    assert pick(random.Random(3), "host", "novel", k=4) == pick(random.Random(3), "host", "novel", k=4)
    assert len(set(pick(random.Random(3), "section", "novel", k=3))) == 3
    assert set(pick(random.Random(3), "port", "novel", k=4)) <= set(part("port", "train"))
    with pytest.raises(ValueError, match="makes novel words up"):
        part("host", "novel")


def test_english_word_splits_are_disjoint_and_share_no_letters_run_with_any_pool_item():
    import random

    from reterm_jax.tasks.pools import pick
    from reterm_jax.tasks.words import WORDS
    train, val = set(word_part("words")), set(word_part("words-val"))
    assert train and val and not train & val and train | val == set(WORDS)
    assert len(val) > 150  # a validation slice's names are not a handful of words
    runs = {r for items in POOLS.values() for x in items for r in re.findall(r"[a-z]+", str(x))}
    assert not runs & set(WORDS)  # no held-out (nor train) pool word, nor a part of one
    for split, part_words in (("words", train), ("words-val", val)):
        hosts = pick(random.Random(5), "host", split, k=4)
        assert hosts == pick(random.Random(5), "host", split, k=4)  # seeded
        letters = {r for h in hosts for r in re.findall(r"[a-z]+", h)}
        assert letters <= part_words, (split, hosts)
        shapes = {re.sub(r"[a-z]+", "a", w) for w in part("host", "train")}
        assert all(re.sub(r"[a-z]+", "a", h) in shapes for h in hosts)
    with pytest.raises(ValueError, match="has no words"):
        word_part("novel")


def test_token_words_are_the_tokenizers_own_and_cover_it():
    """The `tokens` split's words are exactly the tiny tokenizer's lower-case tokens of 2+ letters
    (minus pool letter runs and three keys), each written as one token, so its names make a model
    write tokens English words never produce (experiments/learning/notebook.md, run 32)."""
    import random

    from reterm_jax.data.tokenizer import load_tokenizer
    from reterm_jax.tasks.pools import pick
    from reterm_jax.tasks.words import TOKEN_WORDS
    tok = load_tokenizer()
    runs = {r for items in POOLS.values() for x in items for r in re.findall(r"[a-z]+", str(x))}
    vocab = {tok.decode([i]) for i in range(len(tok))}
    expected = {t for t in vocab if re.fullmatch(r"[a-z]{2,}", t)} - runs - {"host", "port", "name"}
    assert set(TOKEN_WORDS) == expected and len(TOKEN_WORDS) == len(expected)
    assert "amp" in TOKEN_WORDS and not set(TOKEN_WORDS) & runs
    assert all(len(tok.encode(w, add_special_tokens=False)) == 1 for w in TOKEN_WORDS)
    assert word_part("tokens") == TOKEN_WORDS
    hosts = pick(random.Random(5), "host", "tokens", k=40)
    assert hosts == pick(random.Random(5), "host", "tokens", k=40)  # seeded
    assert {r for h in hosts for r in re.findall(r"[a-z]+", h)} <= set(TOKEN_WORDS)


def test_instances_cover_every_family_and_kind_and_load(splits):
    for split, dirs in splits.items():
        seen = set()
        for d in dirs:
            task = load_task(d)
            meta = _generator_meta(d)
            seen.add((meta["family"], meta["fault_kind"]))
            assert task.fault_commands, d.name
            assert (d / "environment/Dockerfile").read_text().startswith("FROM reterm/base:bookworm\n")
            assert "reward.txt" in (d / "tests/test.sh").read_text()
            # the instruction never leaks the verifier or the oracle
            assert "/tests" not in task.instruction and "solve.sh" not in task.instruction
        assert seen == {(f.name, k) for f in ALL for k in f.kinds}, split


def test_held_out_instructions_never_repeat_a_train_one(splits):
    train = {(d / "instruction.md").read_text() for d in splits["train"]}
    assert not train & {(d / "instruction.md").read_text() for d in splits["heldout"]}


def test_cli_writes_tasks_and_rejects_bad_input(tmp_path, capsys):
    assert cli(["generate", "--families=photo-rename,ini-retarget", "--split=heldout", "--count=3",
                "--seed=1", f"--out={tmp_path}"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ini-retarget-heldout-s1-000", "photo-rename-heldout-s1-000", "photo-rename-heldout-s1-001"]
    assert "wrote 3 heldout tasks" in capsys.readouterr().out
    before = _files(tmp_path)
    assert cli(["generate", "--families=photo-rename", "--split=heldout", "--count=1", "--seed=1",
                f"--out={tmp_path}"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli(["generate", "--families=photo-renam", "--split=train", "--count=1",
                f"--out={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "photo-renam" in err and "photo-rename" in err
    assert _files(tmp_path) == before  # nothing was written or removed by the refused runs
    with pytest.raises(ValueError, match="--count=0"):
        generate(parse_families("all"), "train", 0, 0, tmp_path / "x")
    task = str(tmp_path / "ini-retarget-heldout-s1-000")  # demos refuse before any sandbox starts
    for args, says in ((["--reuse=old.jsonl"], "--reuse=old.jsonl adds first-attempt rows to an earlier build: add "
                                               "--solve_rows"),
                       (["--solve_rows", f"--reuse={tmp_path}/none.jsonl"], "none.jsonl: no such file"),
                       (["--solve_rows"], "not from a training split")):
        assert cli(["demos", task, f"--out={tmp_path}/d.jsonl", *args]) == 2
        assert says in capsys.readouterr().err
    assert _files(tmp_path) == before


def test_the_tiny_presets_turn_fits_every_oracle_command(splits):
    """A policy that writes what the teacher wrote must fit each command in one turn: the tiny GRPO
    and eval presets' max_new_tokens_per_turn covers the longest oracle command of every family
    (the tool-call text as the model generates it, a sentence of content and <|im_end|>)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "configs"))
    import eval as eval_config
    import grpo as grpo_config

    from reterm_jax.data import load_tokenizer
    from reterm_jax.data.chat import _tool_calls_text
    from reterm_jax.rl.agent.scripted import split_commands
    tok = load_tokenizer()
    opening = "Let me look at the state the failed attempt left behind."
    longest = 0
    for dirs in splits.values():
        for d in dirs:
            for c in split_commands((d / "solution" / "solve.sh").read_text()):
                call = [{"function": {"name": "bash", "arguments": {"command": c}}}]
                longest = max(longest, len(tok.encode(_tool_calls_text(call, opening))) + 1)
    assert longest > 256  # the csv / log families' heredocs: the old 256 cut them off
    assert grpo_config.get_config("tiny").rollout.max_new_tokens_per_turn >= longest
    assert eval_config.get_config("tiny").limits.max_new_tokens_per_turn >= longest
