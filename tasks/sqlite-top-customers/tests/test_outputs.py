import csv
import io
import sqlite3


def expected():
    db = sqlite3.connect("file:/app/data/sales.db?mode=ro", uri=True)
    cust = {i: (n, c) for i, n, c in db.execute("SELECT id, name, country FROM customers")}
    orders = {i: (cid, d, s) for i, cid, d, s in db.execute("SELECT id, customer_id, order_date, status FROM orders")}
    cents, counted = {}, {}
    for oid, qty, price in db.execute("SELECT order_id, qty, unit_price_cents FROM order_items"):
        cid, d, s = orders[oid]
        if d.startswith("2023-") and s != "cancelled":
            cents[cid] = cents.get(cid, 0) + qty * price
            counted.setdefault(cid, set()).add(oid)
    top = sorted(cents, key=lambda c: (-cents[c], c))[:5]
    rows = [["customer_id", "name", "country", "orders", "revenue"]]
    rows += [[str(c), cust[c][0], cust[c][1], str(len(counted[c])), f"{cents[c] // 100}.{cents[c] % 100:02d}"] for c in top]
    return rows


def test_csv():
    with open("/app/out/top_customers.csv", newline="") as f:
        text = f.read()
    assert "\r" not in text
    assert list(csv.reader(io.StringIO(text))) == expected()
