"""Family `sqlite-price-update` (database): raise one category's prices by a percentage.

A nightly SQL dump in /app/db/backups is the state before any change, so a fault that applies
the update twice, to every row, or with the wrong formula can be undone. The check compares
every row with the expected one (round half up to whole cents) and the schema's table list.
"""
from __future__ import annotations

import random

from reterm_jax.tasks.pools import pick
from reterm_jax.tasks.spec import Instance

KINDS = ("applied-twice", "missing-where", "wrong-formula")


def raise_cents(cents: int, percent: int) -> int:
    return (cents * (100 + percent) + 50) // 100


def make(rng: random.Random, split: str, kind: str) -> Instance:
    categories = pick(rng, "category", split, k=3)
    products = pick(rng, "product", split, k=rng.randint(8, 12))
    percent = pick(rng, "percent", split)
    target = categories[0]
    rows = [(i + 1, p, categories[i % 3] if i < 3 else rng.choice(categories), rng.randint(199, 99999))
            for i, p in enumerate(products)]
    after = [[i, p, c, raise_cents(cents, percent) if c == target else cents] for i, p, c, cents in rows]
    inserts = "\n".join(f"INSERT INTO products VALUES ({i}, '{p}', '{c}', {cents});" for i, p, c, cents in rows)
    update = (f"UPDATE products SET price_cents = (price_cents * {100 + percent} + 50) / 100 "
              f"WHERE category = '{target}';")
    setup = f"""
mkdir -p /app/db/backups
sqlite3 /app/db/shop.db <<'SQL'
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price_cents INTEGER NOT NULL);
{inserts}
SQL
sqlite3 /app/db/shop.db .dump > /app/db/backups/shop-2026-03-31.sql
"""
    solve = f"""
# start from last night's dump: a failed attempt may already have changed prices
rm -f /app/db/shop.db
sqlite3 /app/db/shop.db < /app/db/backups/shop-2026-03-31.sql
sqlite3 /app/db/shop.db "{update}"
"""
    faults = {
        "applied-twice": (f'sqlite3 /app/db/shop.db "{update}"',) * 2,
        "missing-where": ("sqlite3 /app/db/shop.db \"UPDATE products SET price_cents = "
                          f"(price_cents * {100 + percent} + 50) / 100;\"",),
        "wrong-formula": ("sqlite3 /app/db/shop.db \"UPDATE products SET price_cents = "
                          f"price_cents * {percent} / 100 WHERE category = '{target}';\"",),
    }
    check = """
import sqlite3
if not os.path.isfile("/app/db/shop.db"):
    fail("/app/db/shop.db is missing")
try:
    db = sqlite3.connect("file:/app/db/shop.db?mode=ro", uri=True)
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
    rows = [list(r) for r in db.execute("SELECT id, name, category, price_cents FROM products ORDER BY id")]
except sqlite3.Error as e:
    fail(f"cannot read products: {e}")
if tables != ["products"]:
    fail(f"the database holds the tables {tables}, expected only products")
if rows != E["rows"]:
    fail("the products table differs from the expected prices")
"""
    instruction = (
        f"The shop database `/app/db/shop.db` (SQLite) has a `products` table with prices in whole "
        f"cents. Raise the price of every product in the category `{target}` by {percent}%, rounding "
        "half up to whole cents (e.g. 1995 cents + 10% is 2194.5, which rounds to 2195). Change nothing else: other categories, names, ids and tables stay as they are.")
    return Instance(
        family="sqlite-price-update", category="database", instruction=instruction, setup=setup,
        solve=solve, check=check, expect={"rows": after}, fault_kind=kind, fault_commands=faults[kind],
        inspect=("ls -la /app/db /app/db/backups",),
        params={"category": categories, "product": products, "percent": percent}, tags=("sqlite", "sql"))
