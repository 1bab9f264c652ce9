#!/bin/bash
set -euo pipefail
cd /app
mkdir -p out
sqlite3 -header -csv data/sales.db "
WITH rev AS (
  SELECT o.customer_id AS cid, COUNT(DISTINCT o.id) AS n, SUM(i.qty * i.unit_price_cents) AS cents
  FROM orders o JOIN order_items i ON i.order_id = o.id
  WHERE o.order_date >= '2023-01-01' AND o.order_date < '2024-01-01' AND o.status <> 'cancelled'
  GROUP BY o.customer_id)
SELECT c.id AS customer_id, c.name AS name, c.country AS country, rev.n AS orders,
       printf('%d.%02d', rev.cents / 100, rev.cents % 100) AS revenue
FROM rev JOIN customers c ON c.id = rev.cid
ORDER BY rev.cents DESC, c.id ASC LIMIT 5;" | tr -d '\r' > out/top_customers.csv
cat out/top_customers.csv
