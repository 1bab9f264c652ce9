#!/bin/bash
set -euo pipefail
cd /app
mkdir -p out
python3 - <<'PY'
import csv
from collections import defaultdict
from decimal import Decimal
tot = defaultdict(Decimal); cnt = defaultdict(int)
for row in csv.DictReader(open("data/orders.csv", newline="")):
    if row["status"] != "paid":
        continue
    r = row["region"].strip().lower()
    amt = Decimal(row["amount"].replace("USD", "").replace("$", "").replace(",", "").strip())
    tot[r] += amt; cnt[r] += 1
with open("out/region_totals.csv", "w") as f:
    f.write("region,orders,revenue\n")
    for r in sorted(tot, key=lambda r: (-tot[r], r)):
        f.write(f"{r},{cnt[r]},{tot[r]:.2f}\n")
PY
