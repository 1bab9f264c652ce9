import csv, random
random.seed(7)
regions = ["North", " north", "SOUTH", "South ", "East", "west", "West", "Central"]
products = ['Widget', 'Gadget, large', 'Cable "HD"', 'Dock']
with open("/app/data/orders.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["order_id", "date", "region", "product", "amount", "status"])
    for i in range(1, 601):
        amt = random.randrange(500, 250000) / 100
        fmt = random.choice(["{:.2f}", "${:,.2f}", "{:,.2f}", "USD {:.2f}"])
        status = random.choices(["paid", "refunded", "pending"], [80, 10, 10])[0]
        w.writerow([f"A{i:05d}", f"2024-03-{random.randrange(1, 31):02d}", random.choice(regions), random.choice(products), fmt.format(amt), status])
