"""Episodes of the bash harness for a batch of environments, token in / token out.

    trajs = run_episodes(sampler, tokenizer, envs, [initial_messages(task.instruction)] * G,
                         task_ids=[task.name] * G, limits=Limits.tiny(), params=SamplingParams(1.0),
                         key=jax.random.key(0))

One row of the sampler's batch per episode (e.g. G branches of one snapshot). Rows advance in
lockstep, one turn at a time:
  1. every running row generates its turn in one batched `generate` (rows that stop early, or
     have ended, feed pad slots until the longest turn ends);
  2. the tool calls of all rows run concurrently on a SandboxPool (one job per row, its calls in
     order); malformed calls become error observations without running anything;
  3. all observations are appended in ONE right-padded multi-token continuation (`extend`); a row
     without an observation (ended) gets pad slots only.
No row ever waits with a half-fed observation while others generate, and the cache holds, per
row, exactly the prompt + sampled turns + observation pieces, in order. Each row writes at its
own cache position, so a sibling's long turn or observation costs the others compute, never
cache room; a row whose own cache fills ends as `cache_full` (masked in GRPO, not penalised).

Token-in/token-out invariant, asserted at the start of every turn and at the end: the tokens in
the row's cache slots (read back from the sampler) equal the trajectory's record, and the
previous turn's context plus its sampled tokens are a prefix of this turn's context. The history
is never re-rendered: observations are tokenised on their own (`harness.observation_text`).
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

from reterm_jax.data.literal import encode_text
from reterm_jax.data.tokenizer import special_ids
from reterm_jax.rl import harness
from reterm_jax.rl.harness import Limits, ParsedTurn
from reterm_jax.rl.sampler import Sampler
from reterm_jax.rl.sampling import SamplingParams
from reterm_jax.rl.trajectory import Trajectory, Turn

# Rollout engines (rollout.engine): this module's lockstep run_episodes, or rl/continuous.py's slots.
ENGINES = ("lockstep", "continuous")
# Where an attempt is verified: "in_place" = in its own container, its processes ended first (the
# attempt is never continued: sandbox/in_place.py), "clone" = on a clone of its committed state.
VERIFY_MODES = ("in_place", "clone")

# A scripted policy (tests, oracle baselines): given the row and its trajectory so far, the
# assistant text that follows the generation prompt, ending with "<|im_end|>". Its tokens are
# teacher-forced through the same decode path as sampled ones.
Script = Callable[[int, Trajectory], str]


class PrefixInvariantError(AssertionError):
    """The model's context diverged from the trajectory's record (a token-in/token-out bug)."""


def check_prefix(row: int, seen: np.ndarray, record: list[int], previous: list[int] | None) -> None:
    """seen: the tokens in the row's cache; record: the trajectory's tokens; previous: the
    previous turn's context + its sampled tokens (None on the first turn)."""
    seen = [int(t) for t in seen]
    if seen != record:
        at = next((i for i, (a, b) in enumerate(zip(seen, record)) if a != b), min(len(seen), len(record)))
        raise PrefixInvariantError(f"row {row}: the cache holds {len(seen)} tokens, the trajectory {len(record)}; "
                                   f"first difference at {at}")
    if previous is not None and seen[:len(previous)] != previous:
        raise PrefixInvariantError(f"row {row}: the previous turn's context + sampled tokens are not a prefix "
                                   "of this turn's context")


def _tokenize(tokenizer, text: str) -> list[int]:
    """A rendered string's ids: the template's special tokens as themselves, content the renderers
    marked literal (observations, messages) as text (data/literal.py)."""
    return encode_text(tokenizer, text)


def _run_calls(env, parsed: ParsedTurn, timeout: float) -> list[dict]:
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


def _record_turn(traj: Trajectory, tokenizer, tokens: list[int], logprobs: list[float], stopped: bool,
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


def _record_results(turn: Turn, results: list[dict]) -> str | None:
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


def _add_tool_messages(traj: Trajectory, turn: Turn) -> None:
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
    failure = _record_results(turn, results)
    if failure and any(x.get("disk_limit") for x in results):
        traj.error = failure  # the agent's doing: scored 0, not masked
        return harness.DISK_LIMIT, None
    if failure:
        traj.error = f"sandbox failed during the episode: {failure}"
        return harness.SANDBOX_ERROR, None
    piece = _tokenize(tokenizer, harness.observation_text(turn.observations))
    if len(traj.tokens) + len(piece) >= limits.max_tokens:
        return harness.TOKEN_BUDGET, None
    if len(piece) > room:
        return harness.CACHE_FULL, None
    turn.observation = traj.add_context(piece)
    _add_tool_messages(traj, turn)
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


def _thread_map(fn, items, max_workers: int = 0) -> list:
    """SandboxPool.map's contract (an Outcome per item, never raising) on plain threads, for
    callers without a pool (a SandboxPool reaps Docker leftovers on creation, so it needs Docker).
    All items at once (a group's G sandboxes), or at most max_workers at a time."""
    if not items:
        return []
    workers = min(len(items), max_workers) if max_workers > 0 else len(items)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reterm-rollout") as ex:
        return list(ex.map(lambda item: call_outcome(fn, item), items))


@dataclasses.dataclass
class BatchTiming:
    """Where one run_episodes call's wall time went, and how full its decode slots were."""
    prefill_s: float = 0.0      # the first extend (the prompts)
    decode_s: float = 0.0       # generate calls
    observe_s: float = 0.0      # extends of tool observations
    sandbox_s: float = 0.0      # tool calls (the batch waits for the slowest row)
    verify_s: float = 0.0
    decode_tokens: int = 0      # tokens sampled
    row_steps: int = 0          # decode steps x rows: the slots the lockstep loop ran
    rows: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_episodes(sampler: Sampler, tokenizer, envs: Sequence, messages: Sequence[list[dict]], *,
                 task_ids: Sequence[str], limits: Limits, params: SamplingParams = SamplingParams(),
                 key: jax.Array | None = None, script: Script | None = None, pool=None,
                 verify_fn: Callable | None = None,
                 prompt_tokens: Sequence[Sequence[int]] | None = None) -> list[Trajectory]:
    """Run len(envs) episodes to their end; each env has `.exec(command, timeout)` (a DockerSandbox).
    pool: a SandboxPool that runs the rows' tool calls and verifications (default: one thread per
    row). verify_fn(env) -> VerifyResult (e.g. reterm_jax.sandbox.verify) fills reward/resolved.
    Set limits.wall_clock_s from the task's [agent].timeout_sec to honour it.
    prompt_tokens[r]: row r starts from exactly these tokens (a recovery attempt: the failed
    attempt's tokens + `harness.retry_turn_text()` tokenised alone) instead of tokenising
    prompt_text(messages[r]); messages[r] still supplies the message record. Token in/token out:
    the history is never re-rendered."""
    batch = len(envs)
    if not len(messages) == len(task_ids) == batch:
        raise ValueError(f"{batch} envs, {len(messages)} message lists, {len(task_ids)} task ids")
    if prompt_tokens is not None and len(prompt_tokens) != batch:
        raise ValueError(f"{batch} envs but {len(prompt_tokens)} prompt token lists")
    key = jax.random.key(0) if key is None else key
    stop_pad = special_ids(tokenizer).pad
    pmap = pool.map if pool is not None else _thread_map
    started = time.monotonic()
    trajs = [Trajectory(task_id=t, episode_id=f"{t}-{uuid.uuid4().hex[:12]}", messages=[dict(m) for m in msgs],
                        train_from_message_index=len(msgs)) for t, msgs in zip(task_ids, messages)]
    running = np.ones(batch, bool)

    def end(r: int, reason: str) -> None:
        if running[r]:
            running[r] = False
            trajs[r].end_reason = reason

    if prompt_tokens is not None:
        prompts = [[int(x) for x in p] for p in prompt_tokens]
    else:
        prompts = [_tokenize(tokenizer, harness.prompt_text(t.messages)) for t in trajs]
    for r, p in enumerate(prompts):
        if len(p) >= limits.max_tokens:
            end(r, harness.TOKEN_BUDGET)
        elif len(p) >= sampler.max_length:
            end(r, harness.CACHE_FULL)
    fed = [p if running[r] else None for r, p in enumerate(prompts)]
    for r, p in enumerate(fed):
        if p is not None:
            trajs[r].add_context(p)
            trajs[r].prompt_len = len(p)
    timing = BatchTiming(rows=batch)
    t0 = time.monotonic()
    state = sampler.extend(sampler.init(batch), fed)
    timing.prefill_s += time.monotonic() - t0
    previous: list[list[int] | None] = [None] * batch
    for turn_index in range(limits.max_turns + 1):
        for r in np.flatnonzero(running):
            if turn_index >= limits.max_turns:
                end(r, harness.MAX_TURNS)
            elif time.monotonic() - started > limits.wall_clock_s:
                end(r, harness.WALL_CLOCK)
            elif len(trajs[r].tokens) >= limits.max_tokens:
                end(r, harness.TOKEN_BUDGET)
            elif sampler.remaining(state)[r] < 1:
                end(r, harness.CACHE_FULL)
        if not running.any():
            break
        seen = sampler.contexts(state)
        for r in np.flatnonzero(running):
            check_prefix(int(r), seen[r], trajs[r].tokens, previous[r])
        budget = [limits.max_tokens - len(t.tokens) for t in trajs]
        forced = None
        if script is not None:
            forced = [_tokenize(tokenizer, script(r, trajs[r])) if running[r] else None for r in range(batch)]
        t0 = time.monotonic()
        # Row r samples its i-th token from fold_in(fold_in(key, r), i): the episode's tokens
        # depend on its key and its own history only (the continuous engine samples the same).
        state, gen = sampler.generate(state, key, params, limits.max_new_tokens_per_turn, active=running,
                                      row_limits=budget, forced=forced, offsets=[t.num_sampled for t in trajs])
        gen_s = time.monotonic() - t0
        timing.decode_s += gen_s
        timing.decode_tokens += sum(len(t) for t in gen.tokens)
        timing.row_steps += gen.steps * batch

        to_run: dict[int, ParsedTurn] = {}
        for r in np.flatnonzero(running):
            traj, toks = trajs[r], gen.tokens[r]
            parsed = _record_turn(traj, tokenizer, toks, gen.logprobs[r], gen.stopped[r], gen_s, turn_index)
            previous[r] = list(traj.tokens)
            reason = turn_end_reason(parsed, toks, gen.stopped[r], budget[r], gen.cache_full[r], stop_pad)
            if reason is not None:
                end(r, reason)
            else:
                to_run[int(r)] = parsed

        rows = list(to_run)
        t0 = time.monotonic()
        outcomes = pmap(lambda r: _run_calls(envs[r], to_run[r], limits.command_timeout_s), rows)
        timing.sandbox_s += time.monotonic() - t0
        pieces: list[list[int] | None] = [None] * batch
        room = sampler.remaining(state)
        for r, outcome in zip(rows, outcomes):
            reason, pieces[r] = observe(trajs[r], outcome, tokenizer, limits, room[r])
            if reason is not None:
                end(r, reason)
        t0 = time.monotonic()
        state = sampler.extend(state, pieces)
        timing.observe_s += time.monotonic() - t0

    seen = sampler.contexts(state)
    for r in range(batch):
        check_prefix(r, seen[r], trajs[r].tokens, None)
    if verify_fn is not None:
        # A sandbox that failed mid-episode gives a masked sample (end_reason says so), not a reward.
        rows = [r for r in range(batch) if trajs[r].end_reason not in (harness.SANDBOX_ERROR, harness.DISK_LIMIT)]
        for r in range(batch):
            if trajs[r].end_reason == harness.DISK_LIMIT:  # stopped for filling its disk: nothing to verify
                trajs[r].reward, trajs[r].resolved = 0.0, False
        t0 = time.monotonic()
        verified = pmap(verify_fn, [envs[r] for r in rows])
        timing.verify_s += time.monotonic() - t0
        for traj, outcome in zip([trajs[r] for r in rows], verified):
            apply_verification(traj, outcome)
    shared = timing.as_dict()
    for traj in trajs:
        traj.wall_s = time.monotonic() - started
        traj.timing = shared
    return trajs
