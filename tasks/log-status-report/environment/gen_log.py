import random
random.seed(20240611)
ips = [f"10.0.{a}.{b}" for a, b in [(1, 4), (1, 17), (2, 9), (3, 3), (3, 30), (4, 200), (7, 7), (9, 91)]]
weights = [30, 12, 25, 8, 5, 30, 3, 9]
paths = ["/api/v1/items", "/api/v1/items/42", "/api/v1/login", "/health", "/static/app.js", "/api/v1/orders"]
statuses = [200] * 30 + [201] * 3 + [204] * 2 + [301] * 2 + [304] * 4 + [400] * 2 + [401] * 3 + [404] * 5 + [500] * 2 + [502] * 1 + [503] * 1
lines = []
for i in range(1800):
    ip = random.choices(ips, weights)[0]
    hour = random.choices(range(24), [1, 1, 1, 1, 1, 2, 3, 5, 8, 9, 9, 8, 7, 8, 9, 11, 9, 7, 5, 4, 3, 2, 2, 1])[0]
    ts = f"11/Jun/2024:{hour:02d}:{random.randrange(60):02d}:{random.randrange(60):02d} +0000"
    method = random.choice(["GET", "GET", "GET", "POST", "PUT", "DELETE"])
    st = random.choice(statuses)
    size = "-" if st in (204, 304) else str(random.randrange(120, 9000))
    ua = random.choice(["curl/8.1", "Mozilla/5.0 (X11; Linux x86_64)", "svc-client/2.3"])
    lines.append(f'{ip} - - [{ts}] "{method} {random.choice(paths)} HTTP/1.1" {st} {size} "-" "{ua}"')
    if i % 211 == 100:
        lines.append(random.choice(["", "#### log rotated ####", "10.0.1.4 - - [11/Jun/2024:10:00:00 +0000] \"GET /truncated", "garbage line without structure"]))
open("/app/logs/access.log", "w").write("\n".join(lines) + "\n")
