import csv
import io
import sqlite3

SEED = [("BK-101", "Shell Scripting Basics", 2495), ("BK-102", "Regular Expressions, Pocket", 1200),
        ("GM-201", "Terminal Tetris", 995), ("GM-202", 'Rogue "Classic"', 1495), ("TL-301", "Cable tester", 3450),
        ("TL-302", "Crimping tool", 2205), ("BK-103", "SQL for Humans", 3100), ("TL-303", "Label printer", 8990)]
CAT = {"BK": "books", "GM": "games", "TL": "tools"}


def db():
    return sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)


def test_versions_applied_once():
    rows = db().execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
    assert rows == [(1, "init"), (2, "gross_prices"), (3, "categories")]


def test_prices_and_categories():
    con = db()
    assert con.execute("SELECT id, name FROM categories ORDER BY id").fetchall() == [(1, "books"), (2, "games"), (3, "tools")]
    got = con.execute("SELECT p.sku, p.name, p.price_cents, c.name FROM products p JOIN categories c ON c.id = p.category_id ORDER BY p.sku").fetchall()
    want = sorted((sku, name, cents * 120 // 100, CAT[sku[:2]]) for sku, name, cents in SEED)
    assert got == want
    assert con.execute("SELECT COUNT(*) FROM products").fetchone()[0] == len(SEED)
    cols = [r[1] for r in con.execute("PRAGMA table_info(products)")]
    assert cols == ["id", "sku", "name", "price_cents", "category_id"]


def test_catalog_csv():
    buf = io.StringIO(newline="")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["sku", "name", "category", "price"])
    for sku, name, cents in sorted(SEED):
        g = cents * 120 // 100
        w.writerow([sku, name, CAT[sku[:2]], f"{g // 100}.{g % 100:02d}"])
    with open("/app/reports/catalog.csv", newline="") as f:
        assert f.read().replace("\r\n", "\n") == buf.getvalue()
