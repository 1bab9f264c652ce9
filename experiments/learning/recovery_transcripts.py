"""What a policy writes on its first attempt and on the recovery after it, in the same sandbox
(recovery@2's two attempts), task by task: the values each attempt's commands set and how it
ended. A diagnostic for experiments/learning/notebook.md (run 16 re-scored); use validation tasks, not held-out
ones. Needs Docker.

    python experiments/learning/recovery_transcripts.py --hf OUT/warm_start_hf --state OUT/state.json \
        --tasks 'OUT/tasks/val/*' --max_tasks 8 --sampling 0.6,20,0.95
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "configs")]  # runnable from a checkout

from learning_eval import model_policy, parse_sampling, run_config  # noqa: E402  (experiments/learning/)

# the ini-retarget oracle's values: the section it matches, the host and the port it writes
_VALUE = re.compile(r'section == "([^"]*)"|host = ([^\\"\n]*)|port = (\d+)')


def written_values(messages: list[dict]) -> list[str]:
    """The section / host / port values in the commands of these assistant messages."""
    found = []
    for m in messages:
        for call in m.get("tool_calls") or []:
            command = json.loads(call["function"]["arguments"])["command"]
            found += [next(v for v in groups if v) for groups in _VALUE.findall(command)]
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hf", required=True, help="an HF dir (e.g. a learning run's OUT/warm_start_hf)")
    p.add_argument("--state", required=True, help="the learning run's OUT/state.json (its rollout limits)")
    p.add_argument("--tasks", required=True, help="a glob of task dirs")
    p.add_argument("--max_tasks", type=int, default=8)
    p.add_argument("--sampling", default="rollout", help="rollout or TEMPERATURE,TOP_K,TOP_P")
    args = p.parse_args()
    dirs = sorted(Path(d) for d in glob.glob(args.tasks) if os.path.isdir(d))[:args.max_tasks or None]
    if not dirs:
        sys.exit(f"--tasks {args.tasks!r}: no task dirs match; give a glob like 'OUT/tasks/val/*'")
    try:
        sampling = parse_sampling(args.sampling)
    except ValueError as e:
        sys.exit(str(e))
    from reterm_jax.sandbox import DockerSandbox, load_task, verify
    gcfg = run_config(json.load(open(args.state)))
    policy = model_policy(gcfg, args.hf, sampling=sampling)
    for d in dirs:
        task = load_task(d)
        with DockerSandbox.from_task(task) as sb:
            first = policy(task, sb, None, 0, sample=0, stream="")
            v1 = verify(sb, task)  # on a clone: the recovery continues the unverified state
            lines = [f"  attempt 1: {written_values(first.messages)} {first.end_reason}, reward {v1.reward}, "
                     f"context {first.context_tokens} tokens"]
            if not v1.resolved:
                second = policy(task, sb, first.messages, 1, context=first.context, sample=0, stream="")
                v2 = verify(sb, task)
                lines.append(f"  attempt 2: {written_values(second.messages[len(first.messages):])} "
                             f"{second.end_reason}, reward {v2.reward}")
        print(f"{d.name}: {task.instruction.splitlines()[0]}", *lines, sep="\n", flush=True)


if __name__ == "__main__":
    main()
