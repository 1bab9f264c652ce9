"""Parameter pools for generated tasks, split into disjoint `train` and `heldout` parts.

Every value a generated instance draws (a name, a path part, a number) comes from one of
these pools, through `pick(rng, pool, split)`. An item belongs to exactly one split, decided
by a hash of the pool's name and the item, so the two splits never share a value and a
command memorised on a train instance names paths and values no held-out instance has.
About a third of each pool is held out.

A third split, `novel`, is for training too: its words are made up afresh for each instance
(syllables shaped like a train item, e.g. `db-east` -> `vo-kalu`, never an item of any pool), its
numbers come from the train part. A fix on a novel instance can only be right by copying the
names from the instruction or an observation, never by recalling a pool word: SFT rows that teach
copying, and a validation slice that measures copying of names never seen without touching the
held-out pools (experiments/learning/notebook.md).

Two more splits replace each run of letters of a train item with an English word
(reterm_jax/tasks/words.py, `db-east` -> `shallow-tuple`) instead of syllables: `words` for
training, `words-val` (a quarter of the words, by hash, never `words`') for validation only. Made-up
syllables cover few of the tokenizer's merges, so a model that copies them may still never have
written the tokens of real names (held-out hosts; experiments/learning/notebook.md); English words cover
them, and a validation slice of other English words sees what held-out names will. No word is a
letter run of any pool item.

The `tokens` split (training) makes each run of letters one of the tiny tokenizer's own lower-case
tokens (reterm_jax/tasks/words.py TOKEN_WORDS), so its names hold every such token, including the
ones English words never produce (`amp`: no SFT row of the learning experiment had it, so no
policy wrote `.example`; experiments/learning/notebook.md).
"""
from __future__ import annotations

import functools
import hashlib
import random
import re

SPLITS = ("train", "heldout", "novel", "words", "words-val", "tokens")
TRAINING_SPLITS = ("train", "novel", "words", "words-val", "tokens")  # demonstrations and validation; never heldout
MADE_UP_SPLITS = ("novel", "words", "words-val", "tokens")  # words made up per instance; numbers from the train part
WORDS_VAL_SHARE = 4  # one word in WORDS_VAL_SHARE (by hash) is a words-val word
HELDOUT_SHARE = 3  # one item in HELDOUT_SHARE (by hash) is held out


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


POOLS: dict[str, tuple] = {
    "app": _words("atlas beacon cobalt dynamo ember falcon garnet harbor indigo juniper kestrel "
                  "lumen magnet nimbus orchid pylon quartz raven sierra tundra umber vertex willow "
                  "xenon yonder zephyr amber basalt cinder delta"),
    "service": _words("auth billing catalog checkout gateway inventory ledger mailer notifier "
                      "payments profile quota ranking search session shipping storage tracker "
                      "uploads webhook"),
    "section": _words("database cache queue metrics search mailer storage broker scheduler "
                      "session tracing ldap smtp backup"),
    "host": _words("db-east db-west cache-01 cache-02 mq-alpha mq-beta redis-a redis-b pg-main "
                   "pg-replica es-node1 es-node2 smtp-relay ldap-core vault-1 vault-2 mongo-a "
                   "mongo-b kafka-1 kafka-2"),
    "domain": _words("internal corp.example svc.cluster lan prod.example"),
    "category": _words("books garden kitchen outdoor toys music office sports beauty tools "
                       "grocery pets health games travel crafts audio lighting"),
    "product": _words("lamp kettle rake tent puzzle drum stapler racket brush wrench flour leash "
                      "bandage chess atlas yarn speaker bulb mug hose lantern kite guitar binder "
                      "helmet comb pliers rice collar vitamins dice map thread headphones"),
    "feature": _words("retry-budget dark-mode csv-export rate-limit audit-log sso-login "
                      "bulk-upload webhooks-v2 search-facets invoice-pdf geo-fence "
                      "password-reset two-factor cold-storage"),
    "module": _words("utils models views forms tasks helpers client parser loader cache "
                     "schema router"),
    "program": _words("deploy rotate backup healthcheck reindex warmup purge sync archive "
                      "notify compact migrate"),
    "library": _words("common env paths colors logging retry"),
    "upload": _words("uploads incoming dropbox inbox spool submissions"),
    "event": _words("wedding hiking birthday concert graduation reunion picnic regatta "
                    "marathon festival safari carnival roadtrip harvest"),
    "report": _words("errors-by-service error-summary incident-counts error-tally "
                     "failures-report error-census"),
    "totals": _words("category-totals revenue-by-category sales-summary category-revenue "
                     "totals-report"),
    "port": tuple(range(2000, 9000, 7)),
    "percent": tuple(range(3, 40)),
    "minor": tuple(range(1, 40)),
    "photo_count": (4, 5, 6, 7),
}


def is_numeric(pool: str) -> bool:
    return isinstance(POOLS[pool][0], int)


def in_split(pool: str, item, split: str) -> bool:
    """Whether `item` (a pool item) belongs to `split`'s part; a novel split's words are in no pool."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    if split in MADE_UP_SPLITS:
        return is_numeric(pool) and in_split(pool, item, "train")
    digest = hashlib.sha256(f"{pool}\0{item}".encode()).digest()
    heldout = int.from_bytes(digest[:4], "big") % HELDOUT_SHARE == 0
    return heldout == (split == "heldout")


def part(pool: str, split: str) -> tuple:
    """The items of `pool` that belong to `split` (in pool order); a novel split's word pools have
    no items (`pick` makes its words up)."""
    if split in MADE_UP_SPLITS and not is_numeric(pool):
        raise ValueError(f"pool {pool!r} has no {split} items: pick() makes {split} words up")
    items = tuple(x for x in POOLS[pool] if in_split(pool, x, split))
    if not items:
        raise ValueError(f"pool {pool!r} has no {split} items; add items to POOLS[{pool!r}]")
    return items


def pick(rng: random.Random, pool: str, split: str, k: int | None = None):
    """One item of `pool`'s `split` part, or `k` distinct items (a list) when k is given."""
    if split in MADE_UP_SPLITS and not is_numeric(pool):
        return _novel(rng, pool, k, split)
    items = part(pool, split)
    if k is None:
        return rng.choice(items)
    if k > len(items):
        raise ValueError(f"pool {pool!r} has {len(items)} {split} items, {k} asked for")
    return rng.sample(items, k)


_ONSETS, _VOWELS = "bdfgklmnprstvz", "aeiou"
_EVERY_ITEM = frozenset(str(x) for items in POOLS.values() for x in items)


def _made_up(rng: random.Random, length: int) -> str:
    """A pronounceable made-up word about `length` letters long (consonant-vowel syllables)."""
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(max(1, (length + 1) // 2)))


@functools.lru_cache(maxsize=None)
def word_part(split: str) -> tuple[str, ...]:
    """The English words of split `words` or `words-val` (disjoint, by hash), or the token words of
    split `tokens`."""
    from reterm_jax.tasks.words import TOKEN_WORDS, WORDS
    if split == "tokens":
        return TOKEN_WORDS
    if split not in ("words", "words-val"):
        raise ValueError(f"split {split!r} has no words: use words, words-val or tokens")
    return tuple(w for w in WORDS if _is_val_word(w) == (split == "words-val"))


def _is_val_word(word: str) -> bool:
    return int.from_bytes(hashlib.sha256(f"words\0{word}".encode()).digest()[:4], "big") % WORDS_VAL_SHARE == 0


def novel_word(rng: random.Random, pool: str, split: str = "novel") -> str:
    """One made-up value for word pool `pool`: a train item's shape (its separators and digits
    kept) with each run of letters replaced by a made-up word (`novel`) or by an English word
    of `split`'s part (`words`, `words-val`) or a token word (`tokens`); never an item of any pool."""
    return made_up_like(rng, rng.choice(part(pool, "train")), split)


def made_up_like(rng: random.Random, template: str, split: str = "novel") -> str:
    """`template`'s shape (separators and digits kept) with each run of letters made up anew;
    never an item of any pool."""
    words = word_part(split) if split != "novel" else None

    def letters(m: re.Match) -> str:
        return rng.choice(words) if words else _made_up(rng, len(m.group()))

    while True:
        word = re.sub(r"[a-z]+", letters, template)
        if word not in _EVERY_ITEM:
            return word


def is_novel(pool: str, value, split: str = "novel") -> bool:
    """Whether `value` could be a `split` (novel, words, words-val, tokens) value of `pool` (for checks and tests)."""
    if is_numeric(pool):
        return value in part(pool, "train")
    if not isinstance(value, str) or value in _EVERY_ITEM or re.fullmatch(r"[a-z0-9.\-]+", value) is None:
        return False
    return split == "novel" or set(re.findall(r"[a-z]+", value)) <= set(word_part(split))


def _novel(rng: random.Random, pool: str, k: int | None, split: str = "novel"):
    if k is None:
        return novel_word(rng, pool, split)
    words: list[str] = []
    while len(words) < k:
        word = novel_word(rng, pool, split)
        if word not in words:
            words.append(word)
    return words
