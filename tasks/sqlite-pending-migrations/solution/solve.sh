#!/bin/bash
set -euo pipefail
cd /app
# Start from the pre-migration backup so a previous partial / doubled run cannot leak through.
cp backups/shop-v1.db /tmp/shop.db
current=$(sqlite3 /tmp/shop.db "SELECT MAX(version) FROM schema_migrations")
for f in migrations/*.sql; do
  v=$((10#$(basename "$f" | cut -c1-3)))
  if [ "$v" -gt "$current" ]; then
    sqlite3 -bail /tmp/shop.db < "$f"
  fi
done
rm -f shop.db-journal shop.db-wal
cp /tmp/shop.db shop.db
mkdir -p reports
python3 - <<'PY'
import csv, sqlite3
db = sqlite3.connect("/app/shop.db")
rows = db.execute("SELECT p.sku, p.name, c.name, p.price_cents FROM products p JOIN categories c ON c.id = p.category_id ORDER BY p.sku").fetchall()
with open("/app/reports/catalog.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["sku", "name", "category", "price"])
    for sku, name, cat, cents in rows:
        w.writerow([sku, name, cat, f"{cents // 100}.{cents % 100:02d}"])
PY
