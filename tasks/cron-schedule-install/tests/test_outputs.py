import re
import subprocess

RANGES = {0: (0, 59), 1: (0, 23), 2: (1, 31), 3: (1, 12), 4: (0, 7)}
NAMES = {3: ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
         4: ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]}


def value(tok, i):
    tok = tok.lower()
    if i in NAMES and tok in NAMES[i]:
        return NAMES[i].index(tok) + (1 if i == 3 else 0)
    return int(tok)


def expand(field, i):
    lo, hi = RANGES[i]
    out = set()
    for part in field.split(","):
        step = 1
        if "/" in part:
            part, s = part.split("/")
            step = int(s)
        if part == "*":
            a, b = lo, hi
        elif "-" in part:
            a, b = (value(x, i) for x in part.split("-"))
        else:
            a = value(part, i)
            b = hi if step != 1 else a
        assert lo <= a <= b <= hi, field
        out.update(range(a, b + 1, step))
    if i == 4 and 7 in out:
        out = (out - {7}) | {0}
    return out


S = lambda *r: set(x for rr in r for x in rr)  # noqa: E731
ALL = object()
EXPECTED = {
    "/app/bin/backup.sh": ({30}, {2}, ALL, ALL, ALL),
    "/app/bin/rotate-logs.sh": ({0, 15, 30, 45}, set(range(9, 18)), ALL, ALL, {1, 2, 3, 4, 5}),
    "/app/bin/report.sh monthly": ({0}, {6}, {1}, ALL, ALL),
    "/app/bin/cleanup.sh --tmp": ({45}, {23}, ALL, ALL, {0}),
    "/app/bin/healthcheck.sh": (set(range(0, 60, 5)), ALL, ALL, ALL, ALL),
    "/app/bin/sync.sh --full": ({10}, set(range(0, 24, 2)), set(range(1, 16)), {1, 4, 7, 10}, ALL),
}


def parse(text):
    jobs, env = {}, {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$", line)
        if m and len(line.split()) < 6:
            env[m.group(1)] = m.group(2).strip().strip('"')
            continue
        f = line.split(None, 5)
        assert len(f) == 6, line
        assert f[5] not in jobs, "duplicate job " + f[5]
        jobs[" ".join(f[5].split())] = f[:5]
    return jobs, env


def check(text):
    jobs, env = parse(text)
    assert env.get("MAILTO") == "ops@example.com" and env.get("SHELL") == "/bin/bash"
    assert set(jobs) == set(EXPECTED)
    for cmd, want in EXPECTED.items():
        fields = jobs[cmd]
        for i, w in enumerate(want):
            full = set(range(RANGES[i][0], RANGES[i][1] + 1)) if i != 4 else set(range(0, 7))
            if w is ALL:
                assert expand(fields[i], i) == full, (cmd, i, fields[i])
                if i in (2, 4):  # an unrestricted day field must be '*' or cron ORs the day fields
                    assert fields[i].startswith("*"), (cmd, i, fields[i])
            else:
                assert expand(fields[i], i) == w, (cmd, i, fields[i])


def test_file():
    check(open("/app/cron/app.crontab").read())


def test_installed():
    r = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    assert r.returncode == 0
    check(r.stdout)
