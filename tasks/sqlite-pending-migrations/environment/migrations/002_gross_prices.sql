-- Prices were stored net of VAT. From now on price_cents holds the gross price (20% VAT included).
UPDATE products SET price_cents = price_cents * 120 / 100;
INSERT INTO schema_migrations (version, name) VALUES (2, 'gross_prices');
