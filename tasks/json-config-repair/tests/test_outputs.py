import json
import subprocess

P = "/app/settings/service.json"
EXPECTED = {
    "name": "ingest",
    "debug": False,
    "log_level": "warning",
    "listen": {"host": "0.0.0.0", "port": 7000},
    "workers": 8,
    "queues": [
        {"name": "events", "max_size": 10000, "retry": True},
        {"name": "audit", "max_size": 500, "retry": False},
    ],
    "storage": {"path": "/var/lib/ingest", "compress": True, "retention_days": 14},
    "tags": ["prod", "eu"],
}


def strict(x):
    # json.loads accepts NaN/Infinity; reject them; also compare bool vs int strictly
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    if isinstance(x, list):
        return [strict(v) for v in x]
    return (type(x).__name__, x)


def test_valid_with_jq():
    assert subprocess.run(["jq", "-e", ".", P], capture_output=True).returncode == 0


def test_values():
    with open(P) as f:
        data = json.load(f, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert strict(data) == strict(EXPECTED)
