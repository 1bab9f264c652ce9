import sqlite3, sys
ITEMS = [("BK-101", "Shell Scripting Basics", 2495), ("BK-102", "Regular Expressions, Pocket", 1200),
         ("GM-201", "Terminal Tetris", 995), ("GM-202", "Rogue \"Classic\"", 1495), ("TL-301", "Cable tester", 3450),
         ("TL-302", "Crimping tool", 2205), ("BK-103", "SQL for Humans", 3100), ("TL-303", "Label printer", 8990)]
db = sqlite3.connect(sys.argv[1])
db.executescript(open("/app/migrations/001_init.sql").read())
db.executemany("INSERT INTO products (sku, name, price_cents) VALUES (?, ?, ?)", ITEMS)
db.commit()
