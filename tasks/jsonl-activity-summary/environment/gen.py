import json, random
random.seed(2718)
users = ["ana", "ben", "chloe", "dmitri", "esra", "farid"]
repos = ["core/api", "core/web", "tools/cli", "docs/site"]
with open("/app/data/events.jsonl", "w") as f:
    for i in range(500):
        u = random.choice(users)
        kind = random.choices(["PushEvent", "PullRequestEvent", "IssueCommentEvent", "WatchEvent"], [50, 15, 25, 10])[0]
        ev = {"id": str(100000 + i), "type": kind, "actor": {"login": u, "id": users.index(u) + 1},
              "repo": {"name": random.choice(repos)}, "created_at": f"2024-04-{i % 28 + 1:02d}T{i % 24:02d}:00:00Z"}
        if kind == "PushEvent":
            n = random.randint(0, 6)
            ev["payload"] = {"size": n, "commits": [{"sha": f"{random.getrandbits(40):010x}", "message": f"change {j}"} for j in range(n)]}
        elif kind == "PullRequestEvent":
            ev["payload"] = {"action": random.choice(["opened", "closed", "reopened", "opened"]), "number": i}
        else:
            ev["payload"] = {}
        f.write(json.dumps(ev) + "\n")
