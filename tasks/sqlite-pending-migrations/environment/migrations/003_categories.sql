CREATE TABLE categories (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
INSERT INTO categories (name) VALUES ('books'), ('games'), ('tools');
ALTER TABLE products ADD COLUMN category_id INTEGER REFERENCES categories(id);
UPDATE products SET category_id = (SELECT id FROM categories WHERE name =
  CASE WHEN sku LIKE 'BK-%' THEN 'books' WHEN sku LIKE 'GM-%' THEN 'games' ELSE 'tools' END);
INSERT INTO schema_migrations (version, name) VALUES (3, 'categories');
