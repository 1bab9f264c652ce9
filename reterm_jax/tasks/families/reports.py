"""Families that turn data files into a report while the inputs must stay as they are.

`log-error-report` (log analysis): count ERROR lines per service over a current log, a rotated
one and a gzipped one; a tarball in /app/archive holds a copy of the logs.
`csv-category-totals` (CSV): sum the amounts of the categories the instruction names; a
gzipped copy of the CSV sits in /app/data/backup.
The check compares the report with the expected one and the inputs with their original bytes.
"""
from __future__ import annotations

import hashlib
import json
import random
from decimal import Decimal

from reterm_jax.tasks.pools import pick
from reterm_jax.tasks.spec import Instance

LOG_KINDS = ("filter-in-place", "gunzip-rotated", "truncate-current")
CSV_KINDS = ("sort-in-place", "drop-header", "filter-in-place")

_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
_MESSAGES = ("request done", "cache miss", "retrying upstream", "slow query", "connection reset",
             "timeout talking to peer", "queue depth high", "config reloaded")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _log_lines(rng: random.Random, services: list[str], day: int, n: int) -> str:
    lines = []
    for i in range(n):
        t = 3600 + i * rng.randint(5, 60)
        stamp = f"2026-03-{day:02d}T{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}"
        lines.append(f"{stamp} {rng.choice(_LEVELS)} [{rng.choice(services)}] {rng.choice(_MESSAGES)}")
    return "\n".join(lines) + "\n"


def make_log_report(rng: random.Random, split: str, kind: str) -> Instance:
    services = pick(rng, "service", split, k=rng.randint(3, 4))
    report = pick(rng, "report", split)
    logs = {"app.log.2": _log_lines(rng, services, 12, rng.randint(25, 40)),
            "app.log.1": _log_lines(rng, services, 13, rng.randint(25, 40)),
            "app.log": _log_lines(rng, services, 14, rng.randint(25, 40))}
    counts: dict[str, int] = {}
    for text in logs.values():
        for line in text.splitlines():
            _, level, svc, _ = line.split(" ", 3)
            counts[svc.strip("[]")] = counts.get(svc.strip("[]"), 0) + (level == "ERROR")
    out = f"/app/out/{report}.json"
    instruction = (
        f"Write `{out}`: a JSON object that maps every service that appears in the logs under "
        "`/app/logs` to the number of `ERROR` lines it logged. Count all of the logs: the current "
        "`app.log`, the rotated `app.log.1` and the compressed `app.log.2.gz`. A service with no "
        "errors maps to 0. Leave the files in `/app/logs` exactly as they are (same names, same "
        "contents, `app.log.2.gz` stays compressed).")
    writes = "\n".join(f"cat > /app/logs/{name} <<'LOG'\n{text}LOG" for name, text in logs.items())
    setup = f"""
mkdir -p /app/logs /app/out /app/archive
{writes}
gzip -n /app/logs/app.log.2
tar --sort=name --mtime=@1767225600 --owner=0 --group=0 --numeric-owner \\
  -czf /app/archive/logs-2026-03-14.tar.gz -C /app logs
"""
    solve = f"""
# the logs may have been damaged by a failed attempt: restore them from the archive first
rm -rf /app/logs
tar -xzf /app/archive/logs-2026-03-14.tar.gz -C /app
mkdir -p /app/out
python3 - <<'PY'
import gzip, json, re
counts = {{}}
for name in ("app.log", "app.log.1", "app.log.2.gz"):
    path = "/app/logs/" + name
    text = gzip.open(path, "rt").read() if name.endswith(".gz") else open(path).read()
    for line in text.splitlines():
        m = re.match(r"\\S+ (\\w+) \\[([^]]+)\\]", line)
        if m:
            counts.setdefault(m.group(2), 0)
            counts[m.group(2)] += m.group(1) == "ERROR"
json.dump(counts, open("{out}", "w"), indent=2, sort_keys=True)
PY
"""
    faults = {
        "filter-in-place": ("sed -i '/ERROR/!d' /app/logs/app.log /app/logs/app.log.1",
                            f"mkdir -p /app/out && grep -ho '\\[[a-z-]*\\]' /app/logs/app.log /app/logs/app.log.1 "
                            f"| sort | uniq -c > {out}"),
        "gunzip-rotated": ("gunzip /app/logs/app.log.2.gz",),
        "truncate-current": ("> /app/logs/app.log",),
    }
    check = """
import gzip
path = E["out"]
if not os.path.isfile(path):
    fail(f"{path} is missing")
try:
    got = json.loads(read(path))
except ValueError as e:
    fail(f"{path} is not JSON: {e}")
if got != E["counts"]:
    fail(f"{path} holds {got}, not the error counts of the logs")
names = sorted(os.listdir("/app/logs"))
if names != sorted(E["logs"]):
    fail(f"/app/logs holds {names}, expected {sorted(E['logs'])}")
for name, digest in E["logs"].items():
    p = "/app/logs/" + name
    data = gzip.open(p).read() if name.endswith(".gz") else open(p, "rb").read()
    if hashlib.sha256(data).hexdigest() != digest:
        fail(f"{p} was changed")
"""
    expect = {"out": out, "counts": counts,
              "logs": {"app.log": _sha(logs["app.log"]), "app.log.1": _sha(logs["app.log.1"]),
                       "app.log.2.gz": _sha(logs["app.log.2"])}}
    return Instance(
        family="log-error-report", category="log-analysis", instruction=instruction, setup=setup,
        solve=solve, check=check, expect=expect, fault_kind=kind, fault_commands=faults[kind],
        inspect=("ls -la /app/logs /app/archive",),
        params={"service": services, "report": report}, tags=("logs", "json", "gzip"))


def make_csv_totals(rng: random.Random, split: str, kind: str) -> Instance:
    categories = pick(rng, "category", split, k=5)
    wanted = sorted(rng.sample(categories, 3))
    name = pick(rng, "totals", split)
    rows, totals = [], {c: Decimal(0) for c in wanted}
    for i in range(rng.randint(18, 30)):
        cat = categories[i % 5] if i < 5 else rng.choice(categories)
        amount = Decimal(rng.randint(100, 99999)) / 100
        rows.append(f"{1000 + i},{cat},{amount:.2f}")
        if cat in totals:
            totals[cat] += amount
    sales = "id,category,amount\n" + "\n".join(rows) + "\n"
    ordered = sorted(wanted, key=lambda c: (-totals[c], c))
    report = "category,total\n" + "".join(f"{c},{totals[c]:.2f}\n" for c in ordered)
    out = f"/app/out/{name}.csv"
    instruction = (
        f"`/app/data/sales.csv` lists sales (`id,category,amount`). Write `{out}` with the header "
        f"`category,total` and one row for each of the categories {', '.join(f'`{c}`' for c in wanted)}: "
        "the sum of their amounts with exactly two decimals. Sort the rows by total, highest first. "
        "Use Unix line endings. `/app/data/sales.csv` must not change.")
    other = next(c for c in categories if c not in wanted)
    setup = f"""
mkdir -p /app/data/backup /app/out
cat > /app/data/sales.csv <<'CSV'
{sales}CSV
gzip -n -c /app/data/sales.csv > /app/data/backup/sales-2026-03-31.csv.gz
"""
    solve = f"""
# a failed attempt may have rewritten the input: restore it from the backup first
gunzip -c /app/data/backup/sales-2026-03-31.csv.gz > /app/data/sales.csv
mkdir -p /app/out
python3 - <<'PY'
import csv
from decimal import Decimal
wanted = {json.dumps(wanted)}
totals = {{c: Decimal(0) for c in wanted}}
for row in csv.DictReader(open("/app/data/sales.csv", newline="")):
    if row["category"] in totals:
        totals[row["category"]] += Decimal(row["amount"])
with open("{out}", "w") as f:
    f.write("category,total\\n")
    for c in sorted(wanted, key=lambda c: (-totals[c], c)):
        f.write(f"{{c}},{{totals[c]:.2f}}\\n")
PY
"""
    faults = {
        "sort-in-place": ("sort -t, -k2,2 -o /app/data/sales.csv /app/data/sales.csv",),
        "drop-header": ("sed -i 1d /app/data/sales.csv",),
        "filter-in-place": (f"grep -v ',{other},' /app/data/sales.csv > /tmp/s.csv && "
                            "mv /tmp/s.csv /app/data/sales.csv",),
    }
    check = """
if not os.path.isfile(E["out"]):
    fail(f"{E['out']} is missing")
if read(E["out"]) != E["report"]:
    fail(f"{E['out']} differs from the expected totals")
if sha("/app/data/sales.csv") != E["sales_sha256"]:
    fail("/app/data/sales.csv was changed")
"""
    expect = {"out": out, "report": report, "sales_sha256": _sha(sales)}
    return Instance(
        family="csv-category-totals", category="data-processing", instruction=instruction, setup=setup,
        solve=solve, check=check, expect=expect, fault_kind=kind, fault_commands=faults[kind],
        inspect=("ls -la /app/data /app/data/backup", "head -3 /app/data/sales.csv"),
        params={"category": categories, "totals": name}, tags=("csv", "python"))

