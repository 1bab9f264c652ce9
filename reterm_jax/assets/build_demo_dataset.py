"""Build the bundled demo dataset (ReTerm-10K schema) from the bundled tasks, with REAL tool outputs.

    python reterm_jax/assets/build_demo_dataset.py [--tasks tasks] [--out reterm_jax/assets/demo/reterm_demo.jsonl]

Needs Docker (reterm_jax.sandbox). For every task whose task.toml has `[reterm] fault_commands`:
  attempt 1  = the fault commands as bash tool calls, then a wrong "done" claim;
               kept only if the verifier says the task is NOT solved;
  user turn  = "the previous attempt failed, the environment was not reset";
  recovery   = the oracle solution/solve.sh split into its top-level commands, as tool calls, run in
               the post-failure state; kept only if the verifier then says the task IS solved.
Attempt 1 runs once; its end state is snapshotted and branched, and two recovery styles run from it
(one plain, one that looks around first and carries reasoning), so most tasks give two rows.
train_from_message_index is the index of the first recovery assistant message.
"""
import argparse
import hashlib
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from reterm_jax.data.chat import BASH_TOOL  # noqa: E402
from reterm_jax.data.schema import validate_rows  # noqa: E402
# The harness's own prompts and observation format: demo rows must look like RL rollouts.
from reterm_jax.rl.agent.harness import RETRY_PROMPT, SYSTEM_PROMPT, format_observation  # noqa: E402
# The oracle's command splitter lives with the evaluation policies (one copy for both users).
from reterm_jax.rl.agent.scripted import FAULT_OPENING, split_commands  # noqa: E402,F401

log = logging.getLogger("build_demo_dataset")

DONE_CLAIM = "The task is complete."
RECOVERED_CLAIM = "The task is now complete: I repaired the state left by the failed attempt and finished the job."
LOOK_AROUND = "pwd && ls -la"
EXEC_TIMEOUT_S = 120


def call(command: str, index: int) -> dict:
    return {"id": f"call_{index}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command}, ensure_ascii=False)}}


def run_turns(sandbox, steps, start_index: int) -> list[dict]:
    """Run (content, reasoning, command) steps in the sandbox: assistant + tool message per step."""
    messages = []
    for k, (content, reasoning, command) in enumerate(steps):
        r = sandbox.exec(command, timeout=EXEC_TIMEOUT_S)
        if not r.ok:
            raise RuntimeError(f"sandbox failed on {command[:80]!r}: {r.error}")
        msg = {"role": "assistant", "content": content, "tool_calls": [call(command, start_index + k)]}
        if reasoning:
            msg["reasoning_content"] = reasoning
        messages += [msg, {"role": "tool", "content": format_observation(r.output, r.exit_code, r.timed_out)}]
    return messages


def make_row(task_name: str, messages: list[dict], train_from: int, rewards: dict) -> dict:
    sha = hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return {"id": f"{task_name}:{sha[:16]}", "task_id": task_name, "messages": messages,
            "train_from_message_index": train_from, "target_attempt_index": 2, "trajectory_sha256": sha,
            "tools": [BASH_TOOL], "verified_rewards": rewards}


def recovery_steps(solve_commands: list[str], style: int, look_around: tuple[str, ...] = (LOOK_AROUND,)) -> list[tuple]:
    """Style 0 redoes the task at once; style 1 first runs the read-only `look_around` commands."""
    if style == 0:
        return [("Redoing the task from the current state." if i == 0 else "", None, c)
                for i, c in enumerate(solve_commands)]
    steps = [("Let me look at the state the failed attempt left behind." if i == 0 else "",
              "The previous attempt was judged a failure, so its result cannot be trusted. "
              "Check where I am and what is there before changing anything." if i == 0 else None, c)
             for i, c in enumerate(look_around)]
    steps += [("", "Apply the fix step by step from the current state." if i == 0 else "", c)
              for i, c in enumerate(solve_commands)]
    return steps


def rows_for_task(task, look_around: tuple[str, ...] = (LOOK_AROUND,)) -> list[dict]:
    """Rows for one recovery task: its fault_commands as attempt 1, two recovery styles."""
    from reterm_jax.sandbox import DockerSandbox, verify

    head = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.instruction}]
    with DockerSandbox.from_task(task) as sb:
        attempt = run_turns(sb, [(FAULT_OPENING if i == 0 else "", None, c)
                                 for i, c in enumerate(task.fault_commands)], 0)
        first = verify(sb, task)
        if first.resolved or first.error:
            log.warning("%s: attempt 1 %s; no rows", task.name, "passed" if first.resolved else f"errored: {first.error}")
            return []
        history = head + attempt + [{"role": "assistant", "content": DONE_CLAIM},
                                    {"role": "user", "content": RETRY_PROMPT}]
        snap = sb.snapshot()
        try:
            rows = recovery_rows(task, snap.branch(2), history, first.reward, look_around)
        finally:
            snap.release()
    return rows


def recovery_rows(task, branches, history: list[dict], first_reward: float,
                  look_around: tuple[str, ...] = (LOOK_AROUND,)) -> list[dict]:
    """The teacher's recoveries in two copies of one failed state (`branches`, closed here):
    style 0 the oracle at once, style 1 after `look_around`; a row for each the verifier then
    says solved, trained on from its first recovery turn. `history` is everything before the
    recovery (system, task, the failed attempt, the retry user turn)."""
    from reterm_jax.sandbox import verify

    solve = split_commands(open(task.solution_dir / "solve.sh").read())
    rows, branches = [], list(branches)
    try:
        results = []
        for style, branch in enumerate(branches):
            results.append((style, run_turns(branch, recovery_steps(solve, style, look_around), 100),
                            verify(branch, task)))
    finally:  # every branch goes, also when one raised
        for branch in branches:
            branch.close()
    for style, recovery, result in results:
        if not result.resolved:
            log.warning("%s style %d: recovery not verified (reward %s, %s)", task.name, style,
                        result.reward, result.error or result.output[-300:])
            continue
        messages = history + recovery + [{"role": "assistant", "content": RECOVERED_CLAIM}]
        rows.append(make_row(task.name, messages, len(history), {"attempt_1": first_reward, "recovery": result.reward}))
    return rows


def solve_row(task) -> dict | None:
    """A first-attempt row for one task: the oracle's commands from the clean state as attempt 1
    (opening as the failed attempts do, so the first turn cannot tell which follows), trained on
    from its first assistant turn (target_attempt_index 1); None unless the verifier says solved.
    Recovery rows never train a first attempt, so without these a model has never been taught
    to make one (experiments/learning/notebook.md)."""
    from reterm_jax.sandbox import DockerSandbox, verify

    solve = split_commands(open(task.solution_dir / "solve.sh").read())
    head = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.instruction}]
    with DockerSandbox.from_task(task) as sb:
        attempt = run_turns(sb, [(FAULT_OPENING if i == 0 else "", None, c) for i, c in enumerate(solve)], 0)
        result = verify(sb, task)
    if not result.resolved:
        log.warning("%s: the oracle from the clean state was not verified (reward %s, %s); no first-attempt row",
                    task.name, result.reward, result.error or result.output[-300:])
        return None
    row = make_row(task.name, head + attempt + [{"role": "assistant", "content": DONE_CLAIM}], len(head),
                   {"attempt_1": result.reward})
    row["target_attempt_index"] = 1
    return row


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=os.path.join(root, "tasks"))
    parser.add_argument("--out", default=os.path.join(root, "reterm_jax", "assets", "demo", "reterm_demo.jsonl"))
    parser.add_argument("--only", nargs="*", help="task names to build (default: all with fault_commands)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    from reterm_jax.sandbox import load_task

    rows = []
    for name in sorted(os.listdir(args.tasks)):
        path = os.path.join(args.tasks, name)
        if not os.path.exists(os.path.join(path, "task.toml")) or (args.only and name not in args.only):
            continue
        task = load_task(path)
        if not task.fault_commands:
            continue
        try:
            new = rows_for_task(task)
        except Exception as e:  # one broken task must not lose the others' rows
            log.error("%s: %s: %s", name, type(e).__name__, e)
            continue
        log.info("%s: %d rows", name, len(new))
        rows += new
    good, report = validate_rows(rows)
    if report.invalid:
        raise SystemExit(f"{report.invalid} generated rows failed validation: {[str(e) for e in report.errors]}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows from {len({r['task_id'] for r in rows})} tasks to {args.out}")


if __name__ == "__main__":
    main()
