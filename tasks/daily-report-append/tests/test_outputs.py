import gzip
import hashlib
from pathlib import Path

LOGS = [Path(f"/app/logs/archive/app-2024-11-{d:02d}.log.gz") for d in range(1, 7)] + [Path("/app/logs/app-2024-11-07.log")]
LOG_SHA = {
    "app-2024-11-01.log.gz": "90724937b66f332c4138f1ab99570aeeb773392c73084a950fda9de0fd8937a2",
    "app-2024-11-02.log.gz": "ffc6061065fecc8516bea29d64860b0a09fe2058b6e5560ed57e3f6c3f64c2a3",
    "app-2024-11-03.log.gz": "38bb5a7975e0719dd298d888f990684b952ec0804f527a88012b1a1e061a37e2",
    "app-2024-11-04.log.gz": "d42c0f5db77ba893ac8318eb303c46b7fe7e2256e2fb787b96f6d2a1158654a8",
    "app-2024-11-05.log.gz": "a3270ad974a32d3eb7e95da0faa106c6ea64ad22742ff44202db0adf7702a050",
    "app-2024-11-06.log.gz": "8a12e9579bba15836f5f73136da05b97ee1b5099499ac7fd937c8ef9c90785a7",
    "app-2024-11-07.log": "f21bf31bb0020d488ef1dcb1c28df62f458dfebef870cf9ea4c17555582b7b73",
}


def summary(p):
    data = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    n = e = b = 0
    for line in data.decode().splitlines():
        f = line.split()
        if len(f) == 6:
            n += 1
            e += int(f[4]) >= 500
            b += int(f[5])
    return f"2024-11-{LOGS.index(p) + 1:02d},{n},{e},{b}"


def test_logs_untouched():
    for p in LOGS:
        data = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        assert hashlib.sha256(data).hexdigest() == LOG_SHA[p.name], p


def test_report():
    want = "date,requests,errors,bytes\n" + "".join(summary(p) + "\n" for p in LOGS)
    assert Path("/app/reports/daily.csv").read_text() == want
