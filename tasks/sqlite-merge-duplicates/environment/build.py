import sqlite3, subprocess, sys
sys.path.insert(0, "/tmp")
from seed import CUSTOMERS, ORDERS
db = sqlite3.connect("/app/crm.db")
db.executescript("""
CREATE TABLE customers (id INTEGER PRIMARY KEY, email TEXT NOT NULL, name TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), total_cents INTEGER NOT NULL);
""")
db.executemany("INSERT INTO customers VALUES (?, ?, ?)", CUSTOMERS)
db.executemany("INSERT INTO orders VALUES (?, ?, ?)", ORDERS)
db.commit(); db.close()
dump = subprocess.run(["sqlite3", "/app/crm.db", ".dump"], capture_output=True, text=True, check=True).stdout
open("/app/backups/crm-nightly.sql", "w").write(dump)
