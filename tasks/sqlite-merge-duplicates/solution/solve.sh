#!/bin/bash
set -euo pipefail
cd /app
# Rebuild from the nightly dump: safe even if an earlier attempt deleted rows or orphaned orders.
rm -f /tmp/crm.db
sqlite3 -bail /tmp/crm.db < backups/crm-nightly.sql
sqlite3 -bail /tmp/crm.db <<'SQL'
BEGIN;
CREATE TEMP TABLE keep AS
  SELECT c.id AS old_id,
         (SELECT MIN(k.id) FROM customers k WHERE lower(trim(k.email)) = lower(trim(c.email))) AS new_id
  FROM customers c;
UPDATE orders SET customer_id = (SELECT new_id FROM keep WHERE old_id = orders.customer_id);
DELETE FROM customers WHERE id IN (SELECT old_id FROM keep WHERE old_id <> new_id);
UPDATE customers SET email = lower(trim(email));
CREATE UNIQUE INDEX idx_customers_email ON customers(email);
COMMIT;
SQL
cp /tmp/crm.db crm.db
sqlite3 crm.db "SELECT c.id, c.email, COUNT(o.id) FROM customers c LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id"
