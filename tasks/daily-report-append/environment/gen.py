import gzip, random, subprocess
random.seed(1107)
paths = ["/api/items", "/api/orders", "/login", "/health"]
for day in range(1, 8):
    lines = []
    for i in range(random.randint(150, 400)):
        s = random.choices([200, 201, 302, 404, 500, 503], [70, 5, 5, 10, 6, 4])[0]
        lines.append(f"2024-11-{day:02d}T{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}Z INFO {random.choice(['GET', 'POST'])} {random.choice(paths)} {s} {random.randint(100, 20000)}")
    text = "\n".join(lines) + "\n"
    if day < 7:
        with gzip.GzipFile(f"/app/logs/archive/app-2024-11-{day:02d}.log.gz", "wb", mtime=0) as g:
            g.write(text.encode())
    else:
        open("/app/logs/app-2024-11-07.log", "w").write(text)
rows = ["date,requests,errors,bytes"]
for day in range(1, 7):
    out = subprocess.run(["bash", "/app/bin/summarize.sh", f"/app/logs/archive/app-2024-11-{day:02d}.log.gz"], capture_output=True, text=True, check=True).stdout
    rows.append(out.splitlines()[1])
open("/app/reports/daily.csv", "w").write("\n".join(rows) + "\n")
