import csv
import re
from pathlib import Path


def expected():
    tot, cnt = {}, {}
    with open("/app/data/orders.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["status"] != "paid":
                continue
            r = row["region"].strip().lower()
            cents = int(re.sub(r"[^0-9]", "", row["amount"]))  # all amounts carry exactly 2 decimals
            tot[r] = tot.get(r, 0) + cents
            cnt[r] = cnt.get(r, 0) + 1
    rows = sorted(tot, key=lambda r: (-tot[r], r))
    return "region,orders,revenue\n" + "".join(f"{r},{cnt[r]},{tot[r] // 100}.{tot[r] % 100:02d}\n" for r in rows)


def test_totals():
    out = Path("/app/out/region_totals.csv").read_bytes().decode()
    assert out == expected()


def test_input_untouched():
    lines = Path("/app/data/orders.csv").read_text().splitlines()
    assert len(lines) >= 601 and lines[0].startswith("order_id,")
