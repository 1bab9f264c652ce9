"""Teacher guidance (rl/grpo/guidance.py) without Docker: the teacher's turns are what the chat
template renders for the demonstration rows (checked against transformers' template and SFT's
own encoding), the rollout parser reads the oracle's commands back from them, and the member a
teacher replaces."""
import pytest

from reterm_jax.data import load_tokenizer
from reterm_jax.data.chat import encode_example, normalize_message
from reterm_jax.data.literal import plain
from reterm_jax.rl.grpo import guidance
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import Limits, initial_messages, observation_text, parse_assistant, prompt_text
from reterm_jax.rl.agent.scripted import DONE_CLAIM, split_commands
from reterm_jax.rl.agent.turns import tokenize

COMMANDS = ["cat /app/config.ini", "sed -i 's/^port = .*/port = 8080/' /app/config.ini && grep -c '<tag>' /app/x",
            "python3 - <<'EOF'\nprint('a \"quoted\" <|im_end|> text')\nEOF"]
OBSERVATIONS = ["[core]\nport = 1\n[exit code 0]", "0\n[exit code 1]", "a \"quoted\" <|im_end|> text\n[exit code 0]"]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _conversation():
    history = initial_messages("Set the port.") + [{"role": "assistant", "content": "Done."}]
    messages = initial_messages("", history=history)  # the recovery's context: failed attempt + retry turn
    teacher = guidance.teacher_messages(COMMANDS, DONE_CLAIM)
    full = list(messages)
    for m, obs in zip(teacher, OBSERVATIONS + [None]):
        full.append(m)
        if obs is not None:
            full.append({"role": "tool", "content": obs})
    return messages, teacher, full


def test_teacher_turns_are_the_template_render_of_the_demonstration(tok):
    messages, teacher, full = _conversation()
    turns = [guidance.turn_text(m) for m in teacher]
    pieces = [prompt_text(messages)]
    for turn, obs in zip(turns, OBSERVATIONS + [None]):
        pieces.append(turn)
        if obs is not None:
            pieces.append(observation_text([obs]))
    # what a rollout's record holds, as text, is the template's render of the conversation
    reference = tok.apply_chat_template([normalize_message(m) for m in full], tools=harness.TOOLS, tokenize=False)
    assert plain("".join(pieces)) + "\n" == reference
    # and as tokens: SFT's encoding of the same row trains on exactly the teacher-forced tokens
    # (plus each turn's "<think>\n", which the rollout's generation prompt holds as context)
    row = {"id": "r", "messages": full, "train_from_message_index": len(messages), "tools": harness.TOOLS}
    enc = encode_example(row, tok)
    record = [t for p in pieces for t in tokenize(tok, p)]
    assert list(enc.tokens[:len(record)]) == record
    think = tokenize(tok, guidance.GENERATION_PROMPT_END)
    targets = [t for turn in turns for t in think + tokenize(tok, turn)]
    assert [int(t) for t, m in zip(enc.tokens, enc.loss_mask) if m] == targets
    # the rollout's parser reads each command back from the decoded turn (it runs exactly the
    # oracle's commands; a special-token string inside one stayed text)
    for command, turn in zip(COMMANDS, turns):
        decoded = tok.decode(tokenize(tok, turn))
        parsed = parse_assistant(decoded.removesuffix("<|im_end|>"))
        assert [c.command for c in parsed.calls] == [command] and not parsed.completed
    last = parse_assistant(turns[-1].removesuffix("<|im_end|>"))
    assert last.completed and last.content == DONE_CLAIM


def test_teacher_turns_of_a_task_and_the_limits(tok, tmp_path):
    import dataclasses

    from reterm_jax.sandbox import load_task
    from docker_fixtures import TASKS_DIR
    task = load_task(TASKS_DIR / "make_greeting")
    turns = guidance.teacher_turns(task)
    commands = split_commands((task.solution_dir / "solve.sh").read_text())
    assert len(turns) == len(commands) + 1
    assert guidance.fits(turns, tok, Limits.tiny(max_turns=2, max_new_tokens_per_turn=64))
    assert not guidance.fits(turns, tok, Limits.tiny(max_turns=1, max_new_tokens_per_turn=64))
    assert not guidance.fits(turns, tok, Limits.tiny(max_turns=4, max_new_tokens_per_turn=8))
    # a task without solution/solve.sh has no teacher
    bare = dataclasses.replace(task, path=tmp_path)
    assert guidance.teacher_turns(bare) is None


def test_turn_text_refuses_other_roles():
    with pytest.raises(ValueError, match="assistant"):
        guidance.turn_text({"role": "user", "content": "x"})


@pytest.mark.parametrize("valid,resolved,expected", [
    ([True, True, True], [False, False, False], 2),      # all failed: the last one
    ([True, False, True], [False, False, False], 1),     # a masked member goes first
    ([False, True, False], [False, False, False], 2),
    ([True, True, True], [False, True, False], -1),      # a pass: no guidance
    ([True, False], [False, True], 1),                   # a masked "pass" is no pass
])
def test_replaced_member(valid, resolved, expected):
    assert guidance.replaced_member(valid, resolved) == expected
