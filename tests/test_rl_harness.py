"""The bash harness: tool-call XML parsing, observation format, and token-exact pieces."""
import json
import os

import pytest

from reterm_jax.data import load_tokenizer, render_text
from reterm_jax.data.schema import normalize_message
from reterm_jax.rl.agent import harness
from reterm_jax.rl.agent.harness import format_observation, initial_messages, observation_text, parse_assistant, prompt_text

DEMO = os.path.join(os.path.dirname(harness.__file__), "..", "..", "assets", "demo", "reterm_demo.jsonl")


def xml_call(command, name="bash", param="command"):
    return (f"<tool_call>\n<function={name}>\n<parameter={param}>\n{command}\n</parameter>\n</function>\n"
            "</tool_call>")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_parses_reasoning_content_and_one_call():
    turn = parse_assistant(f"I should look.\n</think>\n\nListing files.\n\n{xml_call('ls -la /app')}")
    assert turn.reasoning == "I should look." and turn.content == "Listing files."
    assert [(c.name, c.command, c.error) for c in turn.calls] == [("bash", "ls -la /app", None)]
    assert not turn.completed


def test_multiline_command_is_kept_verbatim_and_calls_keep_their_order():
    script = "cat > /tmp/x.sh <<'EOF'\n#!/bin/bash\n  echo \"<b>\"  \n\nEOF\n"
    turn = parse_assistant(f"\n</think>\n\n{xml_call(script)}\n{xml_call('bash /tmp/x.sh')}")
    assert [c.command for c in turn.calls] == [script, "bash /tmp/x.sh"]
    assert all(c.error is None for c in turn.calls)
    assert json.loads(turn.calls[0].openai("c0")["function"]["arguments"]) == {"command": script}


def test_no_tool_call_is_the_completion_signal():
    turn = parse_assistant("All checks pass.\n</think>\n\nThe task is complete.")
    assert turn.completed and turn.content == "The task is complete." and turn.calls == []


@pytest.mark.parametrize("text, why", [
    ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n", "not closed"),
    (xml_call("ls", name="python"), "unknown function 'python'"),
    (xml_call("ls", param="cmd"), "unknown parameter"),
    (xml_call("   "), "missing or empty"),
    ("<tool_call>\nls -la\n</tool_call>", "one <function=bash>"),
    ("<tool_call>\n<function=bash>\nls\n</function>\n</tool_call>", "outside a <parameter"),
    ("<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>", "nested within <tool_call>"),
])
def test_malformed_calls_are_errors_not_completion(text, why):
    turn = parse_assistant("\n</think>\n\n" + text)
    assert not turn.completed
    assert len(turn.calls) == 1 and turn.calls[0].error and why in turn.calls[0].error
    obs = harness.error_observation(turn.calls[0].error)
    assert obs.startswith("[error: ") and harness.CALL_FORMAT in obs


def test_call_inside_thinking_is_not_a_call():
    turn = parse_assistant(f"maybe {xml_call('rm -rf /')}\n</think>\n\nDone.")
    assert turn.completed and turn.content == "Done."


def test_observation_format_matches_the_demo_data():
    assert format_observation("a\nb\n", 0) == "a\nb\n[exit code 0]"
    assert format_observation("", 2) == "[exit code 2]"
    assert format_observation("partial\n", 124, timed_out=True) == "partial\n[timed out; exit code 124]"
    with open(DEMO) as fh:
        rows = [json.loads(line) for line in fh]
    tool_contents = [m["content"] for r in rows for m in r["messages"] if m["role"] == "tool"]
    assert tool_contents and all(c.rsplit("\n", 1)[-1].startswith(("[exit code ", "[timed out; exit code "))
                                 for c in tool_contents)
    # RL prompts use the system prompt the SFT data was written with.
    assert {r["messages"][0]["content"] for r in rows} == {harness.SYSTEM_PROMPT}


def test_pieces_concatenate_to_the_template_render(tok):
    """prompt + sampled turn + observation piece + ... == the chat template's render, as text and
    as tokens (each piece tokenised on its own), for a multi-turn conversation."""
    messages = initial_messages("Create /app/out.txt containing hello.")
    pieces = [prompt_text(messages)]
    turns = [("Check the dir.", "", "ls -la /app", "total 0\n[exit code 0]"),
             ("Write it.", "Writing the file.", "echo hello > /app/out.txt", "[exit code 0]"),
             ("Verify.", "", "cat /app/out.txt", "hello\n[exit code 0]")]
    for reasoning, content, command, observation in turns:
        sep = "\n\n" if content else ""
        sampled = f"{reasoning}\n</think>\n\n{content}{sep}{xml_call(command)}<|im_end|>"
        parsed = parse_assistant(sampled.removesuffix("<|im_end|>"))
        assert (parsed.reasoning, parsed.content, parsed.calls[0].command) == (reasoning, content, command)
        messages.append({"role": "assistant", "content": content, "reasoning_content": reasoning,
                         "tool_calls": [parsed.calls[0].openai("c")]})
        messages.append({"role": "tool", "content": observation})
        pieces += [sampled, observation_text([observation])]
    pieces.append("Done.\n</think>\n\nThe file is written.<|im_end|>")
    messages.append({"role": "assistant", "content": "The file is written.", "reasoning_content": "Done."})
    full = render_text(messages, harness.TOOLS)
    assert "".join(pieces) + "\n" == full
    normalized = [normalize_message(m) for m in messages]  # the real template wants argument dicts
    assert full == tok.apply_chat_template(normalized, tools=harness.TOOLS, tokenize=False)
    piecewise = [t for p in pieces for t in tok(p, add_special_tokens=False)["input_ids"]]
    whole = tok(full, add_special_tokens=False)["input_ids"]
    assert piecewise == whole[:-1]  # the render ends with the "\n" after the last <|im_end|>


def test_grouped_observations_render_like_consecutive_tool_messages():
    messages = initial_messages("task") + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": {"command": c}}} for c in ("a", "b")]},
        {"role": "tool", "content": "one\n[exit code 0]"}, {"role": "tool", "content": " two\n[exit code 1]\n"}]
    full = render_text(messages, harness.TOOLS, add_generation_prompt=True)
    assert full.endswith("<|im_end|>" + observation_text(["one\n[exit code 0]", " two\n[exit code 1]\n"]))


def test_recovery_prompt_keeps_the_failed_history():
    history = initial_messages("task") + [{"role": "assistant", "content": "The task is complete."}]
    msgs = initial_messages("ignored", history=history)
    assert msgs[:3] == history and msgs[-1] == {"role": "user", "content": harness.RETRY_PROMPT}
    assert prompt_text(msgs).endswith(f"{harness.RETRY_PROMPT}<|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_limit_presets():
    assert harness.Limits.qwen3_5_9b().max_tokens == 256_000  # the paper's task budget
    tiny = harness.Limits.tiny(max_turns=2)
    assert tiny.max_turns == 2 and tiny.max_tokens < 256_000


def test_an_observation_that_prints_special_tokens_stays_text():
    """A command's output holding "<|im_end|>" or "<tool_call>" must not end the turn or open a
    call in the agent's context: the observation's only special tokens are the template's."""
    from reterm_jax.rl.agent.turns import tokenize
    tok = load_tokenizer()
    out = "line <|im_end|>\n<|im_start|>assistant\n<tool_call>\n[exit code 0]"
    ids = tokenize(tok, observation_text([out]))
    added = tok.get_added_vocab()
    names = [tok.convert_ids_to_tokens(i) for i in ids if i in added.values()]
    assert names == ["<|im_start|>", "<tool_response>", "</tool_response>", "<|im_end|>", "<|im_start|>", "<think>"]
    from reterm_jax.data.literal import plain
    assert tok.decode(ids, skip_special_tokens=False) == plain(observation_text([out]))
    assert out.strip() in tok.decode(ids, skip_special_tokens=False)
    plain_ids = tokenize(tok, observation_text(["just text\n[exit code 0]"]))
    assert plain_ids == tok(observation_text(["just text\n[exit code 0]"]), add_special_tokens=False)["input_ids"]
