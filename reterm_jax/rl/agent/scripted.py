"""Scripted attempts: a task's solve.sh or its fault commands run as bash tool calls, as an agent would.

    commands = oracle_commands(task)                  # solve.sh split into its top-level commands
    result = run_commands(task, sandbox, history, commands)   # one tool call each, then "done"

Scripted attempts run their commands DIRECTLY through `sandbox.exec` (the harness's persistent
shell, its timeout and its observation format), not through the episode engines' `script=` path:
that path needs a model and a sampler to teacher-force the tokens, which would make the oracle
baseline (and its Pass@1 = 1.0 check) cost a model compile per run. Their token count is 0.
Used by the evaluation policies, the failure bank's scripted-fault seeding and teacher guidance.
"""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import time

from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import format_observation, initial_messages

DONE_CLAIM = "The task is complete."


@dataclasses.dataclass
class AttemptResult:
    messages: list[dict]           # the whole conversation so far (history + this attempt)
    end_reason: str                # one of harness.END_REASONS
    tokens: int = 0                # tokens the model produced (0 for scripted policies)
    context_tokens: int = 0        # tokens the model's cache saw (0 for scripted policies)
    turns: int = 0
    time_s: float = 0.0
    error: str | None = None       # the attempt's own failure (sandbox broke, task unusable)
    context: list[int] | None = None  # the model's exact token context at the attempt's end (model policy);
    #                                   a Recovery@k continuation continues these, never a re-render


# ---- solve.sh -> tool calls -------------------------------------------------------------------
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def _complete(chunk: str) -> bool:
    return subprocess.run(["bash", "-n", "-c", chunk], capture_output=True).returncode == 0


def split_commands(script: str) -> list[str]:
    """Top-level commands of a shell script, one tool call each. A chunk ends when bash -n accepts it
    and no heredoc or line continuation is open. The shebang, `set -e`-style lines (a persistent
    agent shell must not exit on the first error) and comment-only lines between commands are dropped."""
    commands, chunk, heredocs = [], [], []
    for line in script.splitlines():
        if not chunk:
            stripped = line.strip()
            if not stripped or stripped.startswith("#") or re.fullmatch(r"set\s+-[a-z]+(\s+pipefail)?", stripped):
                continue
        chunk.append(line)
        if heredocs:
            if line.strip() == heredocs[0] or (line.lstrip("\t") == heredocs[0]):
                heredocs.pop(0)
        else:
            heredocs.extend(m.group(2) for m in _HEREDOC.finditer(line))
        if heredocs or line.endswith("\\"):
            continue
        text = "\n".join(chunk)
        if _complete(text):
            commands.append(text)
            chunk = []
    if chunk:
        raise ValueError(f"script ends inside an unfinished command: {chr(10).join(chunk)[:200]!r}")
    return _join_shell_variables(commands)


_ASSIGN = re.compile(r"(?:^|[\s;&|(])([A-Za-z_][A-Za-z0-9_]*)=|(?:mapfile|readarray)\s+(?:-\S+\s+)*([A-Za-z_][A-Za-z0-9_]*)")


def _join_shell_variables(commands: list[str]) -> list[str]:
    """Only exported variables persist between tool calls, so a command that sets a plain shell
    variable is joined with every later command that reads it."""
    out, i = [], 0
    while i < len(commands):
        end, k = i, i
        while k <= end:
            for var in {a or b for a, b in _ASSIGN.findall(commands[k])}:
                if re.search(rf"export\s+{var}=", commands[k]):
                    continue
                users = [m for m in range(end + 1, len(commands)) if re.search(rf"\$\{{?{var}\b", commands[m])]
                end = max([end] + users)
            k += 1
        out.append("\n".join(commands[i:end + 1]))
        i = end + 1
    return out


def tool_call(command: str, index: int) -> dict:
    """One bash tool call as a chat message's `tool_calls` item (id call_<index>)."""
    return {"id": f"call_{index}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command}, ensure_ascii=False)}}


FAULT_OPENING = "I will make the change."  # the demo rows' failed attempts open with this


def run_commands(task, sandbox, history, commands, claim: str = DONE_CLAIM, opening: str = "") -> AttemptResult:
    """Run `commands` as one tool call each (assistant + tool message per call), then `claim`.
    `opening`: the text of the first assistant message (the others say nothing besides the call)."""
    start = time.monotonic()
    messages = initial_messages(task.instruction, history)
    timeout = min(harness.Limits().command_timeout_s, task.agent_timeout_s)
    for i, command in enumerate(commands):
        r = sandbox.exec(command, timeout=timeout)
        messages.append({"role": "assistant", "content": "" if i else opening,
                         "tool_calls": [tool_call(command, len(messages))]})
        messages.append({"role": "tool", "content": format_observation(r.output, r.exit_code, r.timed_out)})
        if r.error:  # the sandbox broke (not the command): the attempt is a masked failure
            return AttemptResult(messages, harness.SANDBOX_ERROR, turns=i + 1,
                                 time_s=time.monotonic() - start, error=r.error)
    messages.append({"role": "assistant", "content": claim})
    return AttemptResult(messages, harness.COMPLETED, turns=len(commands) + 1, time_s=time.monotonic() - start)


def oracle_commands(task) -> list[str]:
    return split_commands((task.solution_dir / "solve.sh").read_text())
