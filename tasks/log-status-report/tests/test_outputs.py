import json
from collections import Counter
from pathlib import Path

LOG = Path("/app/logs/access.log")


def parse():
    good, bad = [], 0
    for line in LOG.read_text().split("\n")[:-1]:
        parts = line.split(" ")
        try:
            assert line.count('"') == 6 and parts[1] == "-" and parts[3].startswith("[")
            q = line.split('"')
            tail = q[2].split()
            assert len(tail) == 2 and len(tail[0]) == 3 and tail[0].isdigit()
            assert tail[1] == "-" or tail[1].isdigit()
            hour = parts[3].split(":")[1]
            good.append((parts[0], hour, tail[0], 0 if tail[1] == "-" else int(tail[1])))
        except (AssertionError, IndexError):
            bad += 1
    return good, bad


def test_report():
    rep = json.loads(Path("/app/report.json").read_text())
    good, bad = parse()
    assert set(rep) == {"total_requests", "malformed", "status_counts", "bytes_total", "error_rate", "top_ips", "busiest_hour"}
    assert rep["total_requests"] == len(good)
    assert rep["malformed"] == bad
    assert rep["status_counts"] == dict(Counter(g[2] for g in good))
    assert rep["bytes_total"] == sum(g[3] for g in good)
    assert abs(rep["error_rate"] - round(sum(g[2][0] == "5" for g in good) / len(good), 4)) < 1e-9
    ips = sorted(Counter(g[0] for g in good).items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    assert rep["top_ips"] == [{"ip": i, "count": c} for i, c in ips]
    hours = sorted(Counter(g[1] for g in good).items(), key=lambda kv: (-kv[1], kv[0]))
    assert rep["busiest_hour"] == hours[0][0]
