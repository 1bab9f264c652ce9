"""One turn of an episode, token in / token out: the pieces both episode engines (the lockstep
`rollout.run_episodes` and the slots of `continuous.SlotEngine`) and the GRPO producer share.

    tokenize(tokenizer, text)            a rendered piece's ids, exact (no re-normalising)
    record_turn / observe / run_calls    a sampled turn into the trajectory; its tool calls; their
                                         observation tokens
    continuation_prompt(tok, tokens)     a failed attempt's exact tokens + the retry user turn
    thread_map(fn, items)                SandboxPool.map's contract on plain threads
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor


from reterm_jax.data.literal import encode_text
from reterm_jax.data.tokenizer import special_ids
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import Limits, ParsedTurn
from reterm_jax.rl.agent.trajectory import Trajectory, Turn


def tokenize(tokenizer, text: str) -> list[int]:
    """A rendered string's ids: the template's special tokens as themselves, content the renderers
    marked literal (observations, messages) as text (data/literal.py)."""
    return encode_text(tokenizer, text)


def run_calls(env, parsed: ParsedTurn, timeout: float) -> list[dict]:
    """Run one row's tool calls in order; stop at a sandbox failure (the rest would fail too)."""
    results = []
    for call in parsed.calls:
        if call.error:
            results.append({"command": call.command, "observation": harness.error_observation(call.error),
                            "output": "", "exit_code": None, "timed_out": False, "exec_s": 0.0, "error": None})
            continue
        r = env.exec(call.command, timeout=timeout)
        results.append({"command": call.command, "output": r.output, "exit_code": r.exit_code,
                        "timed_out": r.timed_out, "exec_s": r.duration_s, "error": r.error,
                        "disk_limit": bool(getattr(r, "disk_limit", False)),
                        "observation": harness.format_observation(r.output, r.exit_code, r.timed_out)})
        if r.error:
            break
    return results


def record_turn(traj: Trajectory, tokenizer, tokens: list[int], logprobs: list[float], stopped: bool,
                 gen_s: float, turn_index: int) -> ParsedTurn:
    """Append the sampled tokens, the Turn and the assistant message; return the parsed turn."""
    context_len = len(traj.tokens)
    span = traj.add_sampled(tokens, logprobs)
    body = tokens[:-1] if stopped else tokens
    text = tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    parsed = harness.parse_assistant(text)
    traj.turns.append(Turn(context_len=context_len, sampled=span, text=text, reasoning=parsed.reasoning,
                           content=parsed.content, stop="stop" if stopped else "length", gen_s=gen_s,
                           tool_calls=[{"name": c.name, "arguments": c.arguments, "error": c.error, "raw": c.raw}
                                       for c in parsed.calls]))
    message = {"role": "assistant", "content": parsed.content, "reasoning_content": parsed.reasoning}
    runnable = [c for c in parsed.calls if not c.error]
    if runnable:
        message["tool_calls"] = [c.openai(f"call_{turn_index}_{i}") for i, c in enumerate(runnable)]
    elif parsed.calls:  # malformed only: keep the markup, so the tool message that follows has its call
        message["content"] = text.partition("</think>")[2].strip() if "</think>" in text else text.strip()
    traj.messages.append(message)
    return parsed


def record_results(turn: Turn, results: list[dict]) -> str | None:
    """Copy one row's call results into its Turn; return the sandbox failure, if any."""
    for x in results:
        if "observation" in x:
            turn.commands.append(x["command"])
            turn.outputs.append(x["output"])
            turn.exit_codes.append(x["exit_code"])
            turn.timed_out.append(x["timed_out"])
            turn.exec_s.append(x["exec_s"])
            turn.observations.append(x["observation"])
    return next((x["error"] for x in results if x.get("error")), None)


def add_tool_messages(traj: Trajectory, turn: Turn) -> None:
    call_ids = iter(c["id"] for c in traj.messages[-1].get("tool_calls", []))
    for obs, call in zip(turn.observations, turn.tool_calls):
        message = {"role": "tool", "content": obs}
        if not call["error"]:
            message["tool_call_id"] = next(call_ids)
        traj.messages.append(message)


def turn_end_reason(parsed: ParsedTurn, tokens: list[int], stopped: bool, budget: int, cache_full: bool,
                    end_of_text: int) -> str | None:
    """Why the episode ends after this sampled turn, or None when its tool calls run next."""
    if not stopped:
        return (harness.TOKEN_BUDGET if len(tokens) >= budget else
                harness.CACHE_FULL if cache_full else harness.TURN_TOO_LONG)
    if tokens[-1] == end_of_text:
        return harness.END_OF_TEXT
    if parsed.completed:
        return harness.COMPLETED
    return None


def observe(traj: Trajectory, outcome, tokenizer, limits: Limits, room: int) -> tuple[str | None, list[int] | None]:
    """Record a turn's tool results (a pool Outcome) and tokenise the observation to append.
    Returns (end reason, None) when the episode ends here, else (None, the observation's tokens),
    already added to the trajectory's context and messages."""
    turn = traj.turns[-1]
    results = outcome.value if outcome.ok else [{"error": outcome.error}]
    failure = record_results(turn, results)
    if failure and any(x.get("disk_limit") for x in results):
        traj.error = failure  # the agent's doing: scored 0, not masked
        return harness.DISK_LIMIT, None
    if failure:
        traj.error = f"sandbox failed during the episode: {failure}"
        return harness.SANDBOX_ERROR, None
    piece = tokenize(tokenizer, harness.observation_text(turn.observations))
    if len(traj.tokens) + len(piece) >= limits.max_tokens:
        return harness.TOKEN_BUDGET, None
    if len(piece) > room:
        return harness.CACHE_FULL, None
    turn.observation = traj.add_context(piece)
    add_tool_messages(traj, turn)
    return None, piece


def apply_verification(traj: Trajectory, outcome) -> None:
    """Copy a verify_fn Outcome into the trajectory (an exception in the verifier: infrastructure)."""
    if outcome.ok:
        traj.reward, traj.resolved = outcome.value.reward, outcome.value.resolved
        rewards = getattr(outcome.value, "rewards", None) or {}
        traj.partial = float(rewards["partial"]) if "partial" in rewards else None
        traj.verify_error = outcome.value.error
        traj.verify_infra = bool(getattr(outcome.value, "infrastructure", False))
    else:
        traj.reward, traj.verify_error, traj.verify_infra = 0.0, outcome.error, True


def call_outcome(fn, item):
    """fn(item) as a SandboxPool Outcome: its value, or the exception as its error (never raises)."""
    from reterm_jax.sandbox.pool import Outcome
    start = time.monotonic()
    try:
        return Outcome(item, fn(item), duration_s=time.monotonic() - start)
    except Exception as e:  # noqa: BLE001 - one bad row never kills the batch
        return Outcome(item, error=f"{type(e).__name__}: {e}", duration_s=time.monotonic() - start)


def thread_map(fn, items, max_workers: int = 0) -> list:
    """SandboxPool.map's contract (an Outcome per item, never raising) on plain threads, for
    callers without a pool (a SandboxPool reaps Docker leftovers on creation, so it needs Docker).
    All items at once (a group's G sandboxes), or at most max_workers at a time."""
    if not items:
        return []
    workers = min(len(items), max_workers) if max_workers > 0 else len(items)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reterm-rollout") as ex:
        return list(ex.map(lambda item: call_outcome(fn, item), items))


def continuation_prompt(tokenizer, tokens: list[int]) -> list[int]:
    """A failed attempt's exact tokens, cut after its last <|im_end|> (an attempt that ended
    mid-turn, e.g. on its turn limit, loses that unfinished turn, as a failure-bank entry does),
    + the retry user turn tokenised alone: the context a recovery attempt continues (GRPO groups
    and Recovery@k evaluation alike)."""
    im_end = special_ids(tokenizer).im_end
    tokens = [int(t) for t in tokens]
    ends = [i for i, t in enumerate(tokens) if t == im_end]
    if not ends:
        raise ValueError("the failed attempt's tokens hold no <|im_end|>: nothing to continue")
    return tokens[:ends[-1] + 1] + tokenize(tokenizer, harness.retry_turn_text())
