"""The single-bash-tool harness: system prompt, prompt/observation tokens, tool-call parsing, limits.

Contract (docs/reterm_method.md): one tool, `bash(command)`, one non-interactive command per
call; cwd and exported env persist; stdin is closed; each call has a timeout; the observation is
the combined (head+tail truncated) output then `[exit code N]` (`[timed out; exit code N]`), the
format of the bundled demo data.

Completion signal: an assistant turn that ends (<|im_end|>) WITHOUT a tool call declares the task
done, as the demo rows end an attempt with a plain claim ("The task is complete."). A turn with
tool-call markup that does not parse is NOT completion: it gets an error observation and the
episode continues. Other ends: turn, token and wall-clock limits (see `Limits`).
"""
from __future__ import annotations

import dataclasses
import json
import re

from reterm_jax.data.chat import BASH_TOOL, render_text
from reterm_jax.data.literal import literal

# The demo / SFT rows are built with this wording (reterm_jax/assets/build_demo_dataset.py imports
# it), so RL prompts look like the data the policy was fine-tuned on (a test checks the shipped rows).
SYSTEM_PROMPT = (
    "You are an autonomous terminal assistant working inside a Linux container. Complete the user's task "
    "using the `bash` tool. Each call runs exactly one non-interactive shell command; stdin is closed, so "
    "never start editors, pagers or prompts. The working directory and exported environment variables "
    "persist from one call to the next. Every result shows the command's combined output and its exit "
    "code. When the task is complete, reply without a tool call and say what you did."
)
RETRY_PROMPT = (
    "Your previous attempt failed: the task was checked and it is not solved. The environment was NOT "
    "reset; it is exactly as your previous attempt left it. Find out what is wrong with the current "
    "state and complete the task."
)
TOOLS = [BASH_TOOL]


def bash_call_xml(command: str) -> str:
    """One bash tool call in the Qwen3.5 XML format, as the model writes it."""
    return f"<tool_call>\n<function=bash>\n<parameter=command>\n{command}\n</parameter>\n</function>\n</tool_call>"


CALL_FORMAT = bash_call_xml("YOUR COMMAND")

# Why an episode ended.
COMPLETED = "completed"            # the agent replied without a tool call
MAX_TURNS = "max_turns"
TOKEN_BUDGET = "token_budget"      # the context reached the task's token budget
CACHE_FULL = "cache_full"          # the sampler's cache row filled first: the engine's limit, masked, not penalised
TURN_TOO_LONG = "turn_token_limit"  # one turn reached max_new_tokens without ending
END_OF_TEXT = "end_of_text"        # the model emitted <|endoftext|> instead of ending its turn
WALL_CLOCK = "wall_clock"
SANDBOX_ERROR = "sandbox_error"    # the environment failed (not the command): a masked sample
DISK_LIMIT = "disk_limit"          # the agent's commands outgrew the task's storage_mb: reward 0, not masked
END_REASONS = (COMPLETED, MAX_TURNS, TOKEN_BUDGET, CACHE_FULL, TURN_TOO_LONG, END_OF_TEXT, WALL_CLOCK, SANDBOX_ERROR,
               DISK_LIMIT)


@dataclasses.dataclass(frozen=True)
class Limits:
    max_turns: int = 100
    max_tokens: int = 256_000            # task budget: prompt + generated + observation tokens
    max_new_tokens_per_turn: int = 16_384
    wall_clock_s: float = 3600.0         # whole episode, checked between turns
    command_timeout_s: float = 120.0     # each bash call

    @classmethod
    def qwen3_5_9b(cls) -> "Limits":
        return cls()  # the paper's 256,000-token task budget

    @classmethod
    def tiny(cls, **overrides) -> "Limits":
        kw = dict(max_turns=4, max_tokens=2048, max_new_tokens_per_turn=64, wall_clock_s=300.0,
                  command_timeout_s=30.0)
        kw.update(overrides)
        return cls(**kw)


def initial_messages(instruction: str, history: list[dict] | None = None) -> list[dict]:
    """[system, user task] (a fresh attempt), or `history` (a failed attempt, ending with its last
    assistant turn) + the retry user turn (Recovery@k: same environment, full failed history)."""
    if history:
        return [*history, {"role": "user", "content": RETRY_PROMPT}]
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]


def prompt_text(messages: list[dict]) -> str:
    """The rendered conversation with the tools block and the generation prompt."""
    # marked: a special-token string inside a message stays text when encode_text tokenises this
    return render_text(messages, TOOLS, add_generation_prompt=True, keep_marks=True)


def observation_text(contents: list[str], enable_thinking: bool = True) -> str:
    """What the chat template renders after an assistant turn's <|im_end|> when tool results
    follow it: the newline ending that turn, the grouped tool-response user turn, and the
    generation prompt. Tokenised on its own and appended to the cache; the tests check that
    prompt + sampled turn + this equals the template's render of the whole conversation."""
    body = "".join(f"\n<tool_response>\n{literal(c.strip())}\n</tool_response>" for c in contents)
    think = "<think>\n" if enable_thinking else "<think>\n\n</think>\n\n"
    return f"\n<|im_start|>user{body}<|im_end|>\n<|im_start|>assistant\n{think}"


def retry_turn_text(enable_thinking: bool = True) -> str:
    """What follows a failed attempt's last <|im_end|> to open a recovery attempt: the newline
    ending that turn, the retry user turn (RETRY_PROMPT) and the generation prompt, exactly as
    `prompt_text(initial_messages(instruction, history))` renders them after the history.
    Tokenised on its own and appended to the failed attempt's exact tokens (never re-rendered:
    a re-render drops earlier <think> blocks), like `observation_text`."""
    think = "<think>\n" if enable_thinking else "<think>\n\n</think>\n\n"
    return f"\n<|im_start|>user\n{RETRY_PROMPT}<|im_end|>\n<|im_start|>assistant\n{think}"


def format_observation(output: str, exit_code: int, timed_out: bool = False) -> str:
    """The tool message content (the demo data's format)."""
    status = f"[timed out; exit code {exit_code}]" if timed_out else f"[exit code {exit_code}]"
    output = output.rstrip("\n")
    return f"{output}\n{status}" if output else status


def error_observation(why: str) -> str:
    return f"[error: {why}. Call the bash tool exactly as:\n{CALL_FORMAT}]"


# ---- parsing -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ToolCall:
    raw: str                     # the markup as sampled
    name: str = ""
    arguments: dict = dataclasses.field(default_factory=dict)
    error: str | None = None     # why the call is malformed (None: it can run)

    @property
    def command(self) -> str:
        return self.arguments.get("command", "")

    def openai(self, call_id: str) -> dict:
        return {"id": call_id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    reasoning: str        # text before </think> (the generation prompt already opened <think>)
    content: str          # text after </think>, without the tool calls
    calls: list[ToolCall]

    @property
    def completed(self) -> bool:
        """No tool call at all (malformed ones included): the completion signal."""
        return not self.calls


_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FUNCTION = re.compile(r"\A\s*<function=([^>\n]*)>(.*?)</function>\s*\Z", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.S)


def _strip_one_newline(value: str) -> str:
    # The template writes "<parameter=x>\n{value}\n</parameter>": drop exactly those newlines.
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def parse_call(raw: str, closed: bool) -> ToolCall:
    """One <tool_call> block (inner text); `closed`: whether </tool_call> was present."""
    full = f"<tool_call>{raw}" + ("</tool_call>" if closed else "")
    if not closed:
        return ToolCall(full, error="the <tool_call> block is not closed with </tool_call>")
    fn = _FUNCTION.match(raw)
    if fn is None:
        return ToolCall(full, error="expected one <function=bash>...</function> block inside <tool_call>")
    name, body = fn.group(1).strip(), fn.group(2)
    if name != "bash":
        return ToolCall(full, name=name, error=f"unknown function {name!r}; the only tool is 'bash'")
    params = {m.group(1).strip(): _strip_one_newline(m.group(2)) for m in _PARAM.finditer(body)}
    leftover = _PARAM.sub("", body).strip()
    if leftover:
        return ToolCall(full, name=name, arguments=params,
                        error="text inside <function=bash> outside a <parameter=...>...</parameter> block")
    unknown = sorted(set(params) - {"command"})
    if unknown:
        return ToolCall(full, name=name, arguments=params, error=f"unknown parameter(s) {unknown}; use 'command'")
    if not params.get("command", "").strip():
        return ToolCall(full, name=name, arguments=params, error="the required parameter 'command' is missing or empty")
    return ToolCall(full, name=name, arguments=params)


def parse_assistant(text: str) -> ParsedTurn:
    """Split a sampled assistant turn (decoded, without its stop token) into reasoning, content
    and tool calls. Markup outside the thinking block that looks like a call but is not inside a
    <tool_call> block is a malformed call, not a completion."""
    reasoning, sep, content = text.partition("</think>")
    if not sep:
        reasoning, content = "", text
    calls, kept, pos = [], [], 0
    for m in _BLOCK.finditer(content):
        kept.append(content[pos:m.start()])
        closed = m.group(0).endswith("</tool_call>")
        calls.append(parse_call(m.group(1), closed))
        pos = m.end()
    kept.append(content[pos:])
    rest = "".join(kept)
    if not calls and ("<function=" in rest or "</tool_call>" in rest):
        calls.append(ToolCall(rest.strip(), error="a <function=...> block must be nested within "
                                                  "<tool_call></tool_call> tags"))
    return ParsedTurn(reasoning=reasoning.strip("\n"), content=rest.strip(), calls=calls)
