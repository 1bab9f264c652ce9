#!/bin/bash
set -euo pipefail
cd /app
mkdir -p out
jq -s '
  group_by(.actor.login)
  | map({
      user: .[0].actor.login,
      pushes: (map(select(.type == "PushEvent")) | length),
      commits: (map(select(.type == "PushEvent") | .payload.commits | length) | add // 0),
      prs_opened: (map(select(.type == "PullRequestEvent" and .payload.action == "opened")) | length),
      repos: (map(select(.type == "PushEvent" and (.payload.commits | length) > 0) | .repo.name) | unique)
    })
  | sort_by(-.commits, .user)
' data/events.jsonl > out/summary.json
cat out/summary.json | head -20
