"""Parameter pools for generated tasks, split into disjoint `train` and `heldout` parts.

Every value a generated instance draws (a name, a path part, a number) comes from one of
these pools, through `pick(rng, pool, split)`. An item belongs to exactly one split, decided
by a hash of the pool's name and the item, so the two splits never share a value and a
command memorised on a train instance names paths and values no held-out instance has.
About a third of each pool is held out.
"""
from __future__ import annotations

import hashlib
import random

SPLITS = ("train", "heldout")
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


def in_split(pool: str, item, split: str) -> bool:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    digest = hashlib.sha256(f"{pool}\0{item}".encode()).digest()
    heldout = int.from_bytes(digest[:4], "big") % HELDOUT_SHARE == 0
    return heldout == (split == "heldout")


def part(pool: str, split: str) -> tuple:
    """The items of `pool` that belong to `split` (in pool order)."""
    items = tuple(x for x in POOLS[pool] if in_split(pool, x, split))
    if not items:
        raise ValueError(f"pool {pool!r} has no {split} items; add items to POOLS[{pool!r}]")
    return items


def pick(rng: random.Random, pool: str, split: str, k: int | None = None):
    """One item of `pool`'s `split` part, or `k` distinct items (a list) when k is given."""
    items = part(pool, split)
    if k is None:
        return rng.choice(items)
    if k > len(items):
        raise ValueError(f"pool {pool!r} has {len(items)} {split} items, {k} asked for")
    return rng.sample(items, k)
