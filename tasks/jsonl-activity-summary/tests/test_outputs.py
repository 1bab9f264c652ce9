import json


def expected():
    users = {}
    with open("/app/data/events.jsonl") as f:
        for line in f:
            e = json.loads(line)
            u = users.setdefault(e["actor"]["login"], {"user": e["actor"]["login"], "pushes": 0, "commits": 0, "prs_opened": 0, "repos": set()})
            if e["type"] == "PushEvent":
                u["pushes"] += 1
                n = len(e["payload"]["commits"])
                u["commits"] += n
                if n:
                    u["repos"].add(e["repo"]["name"])
            elif e["type"] == "PullRequestEvent" and e["payload"]["action"] == "opened":
                u["prs_opened"] += 1
    out = [dict(u, repos=sorted(u["repos"])) for u in users.values()]
    return sorted(out, key=lambda u: (-u["commits"], u["user"]))


def test_summary():
    with open("/app/out/summary.json") as f:
        got = json.load(f)
    assert got == expected()
