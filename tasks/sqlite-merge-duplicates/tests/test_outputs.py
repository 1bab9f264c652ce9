import os
import sqlite3
import sys

sys.path.insert(0, os.path.dirname(__file__))
from seed import CUSTOMERS, ORDERS  # noqa: E402


def expected():
    keep, remap = {}, {}
    for cid, email, name in sorted(CUSTOMERS):
        key = email.strip().lower()
        if key not in keep:
            keep[key] = (cid, key, name)
        remap[cid] = keep[key][0]
    return sorted(keep.values()), sorted((oid, remap[c], t) for oid, c, t in ORDERS)


def con():
    return sqlite3.connect("file:/app/crm.db?mode=ro", uri=True)


def test_customers_and_orders():
    want_c, want_o = expected()
    db = con()
    assert db.execute("SELECT id, email, name FROM customers ORDER BY id").fetchall() == want_c
    assert db.execute("SELECT id, customer_id, total_cents FROM orders ORDER BY id").fetchall() == want_o


def test_unique_index():
    db = con()
    rows = db.execute("PRAGMA index_list(customers)").fetchall()
    idx = {r[1]: r[2] for r in rows}
    assert idx.get("idx_customers_email") == 1
    cols = [r[2] for r in db.execute("PRAGMA index_info(idx_customers_email)")]
    assert cols == ["email"]


def test_backup_kept():
    assert "INSERT INTO customers" in open("/app/backups/crm-nightly.sql").read()
