import random, sqlite3
random.seed(99)
db = sqlite3.connect("/app/data/sales.db")
db.executescript("""
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     order_date TEXT NOT NULL, status TEXT NOT NULL);
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id), product TEXT NOT NULL,
                          qty INTEGER NOT NULL, unit_price_cents INTEGER NOT NULL);
""")
names = ["Acme Ltd", "Borealis AG", "Cobalt & Sons", "Delta, Inc.", "Eagle Works", "Fjord AS", "Granite SpA",
         "Helix BV", "Iris Oy", "Juniper LLC", "Kestrel SA", "Lumen GmbH"]
countries = ["UK", "DE", "US", "US", "UK", "NO", "IT", "NL", "FI", "US", "FR", "DE"]
db.executemany("INSERT INTO customers VALUES (?, ?, ?)", [(i + 1, n, c) for i, (n, c) in enumerate(zip(names, countries))])
oid = 0
for _ in range(400):
    oid += 1
    cust = random.randint(1, 12)
    year = random.choice([2022, 2023, 2023, 2023, 2024])
    date = f"{year}-{random.randint(1, 12):02d}-{random.randint(1, 28):02d}"
    status = random.choices(["shipped", "cancelled", "pending"], [80, 12, 8])[0]
    db.execute("INSERT INTO orders VALUES (?, ?, ?, ?)", (oid, cust, date, status))
    for _ in range(random.randint(1, 4)):
        db.execute("INSERT INTO order_items VALUES (?, ?, ?, ?)", (oid, random.choice("ABCDEFG"), random.randint(1, 9), random.randint(99, 25000)))
db.commit()
