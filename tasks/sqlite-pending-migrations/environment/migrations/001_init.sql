CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT UNIQUE NOT NULL, name TEXT NOT NULL, price_cents INTEGER NOT NULL);
INSERT INTO schema_migrations (version, name) VALUES (1, 'init');
