"""Build the tiny Qwen3.5-style tokenizer in reterm_jax/assets/tokenizer/ (tests and the demo).

    python reterm_jax/assets/build_tiny_tokenizer.py [--out DIR]

A byte-level BPE (Qwen2's pre-tokenizer regex, NFC normaliser, vocabulary of ~1.5k) trained on a
small built-in text mix (shell commands, prose, JSON, tool-call XML), then Qwen3.5's added tokens
appended in the real order (<|endoftext|>, <|im_start|>, <|im_end|>, ..., <tool_call>, ...,
<think>, </think>): small ids, same relative layout as 248044.. in the real vocabulary.
Deterministic: re-running it reproduces the same files.

The chat template is written for this project and behaves like Qwen3.5's official one on text-only
conversations (the real one also renders image/video parts, which ReTerm rows never contain):
* tools: the system turn starts with "# Tools", the tool JSON schemas inside <tools></tools>, the
  XML calling convention, and only then the row's own system prompt (trimmed);
* every message content is trimmed;
* assistant tool calls are XML (<tool_call>/<function=NAME>/<parameter=P>), separated from the
  content by a blank line, from each other by a newline;
* consecutive tool results are grouped into one user turn of "\n<tool_response>\n...\n</tool_response>";
* assistant turns after the last real user query (a user turn that is not only a tool response)
  always carry <think>\n...\n</think>\n\n (empty without reasoning); earlier turns lose it;
* the generation prompt is "<|im_start|>assistant\n<think>\n" (enable_thinking=False closes it).
"""
import argparse
import json
import os
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

CHAT_TEMPLATE = r"""
{%- macro text_of(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for part in content %}
            {%- if 'text' in part %}
                {{- part.text }}
            {%- else %}
                {{- raise_exception('Only text content parts are supported.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is not none and content is defined %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- set has_system = messages[0].role == 'system' %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' ~ (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>' }}
    {{- '\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>' }}
    {%- if has_system %}
        {%- set sys_text = text_of(messages[0].content) | trim %}
        {%- if sys_text %}
            {{- '\n\n' ~ sys_text }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- elif has_system %}
    {{- '<|im_start|>system\n' ~ (text_of(messages[0].content) | trim) ~ '<|im_end|>\n' }}
{%- endif %}
{#- The last real user query: the latest user turn that is not just a tool response. #}
{%- set q = namespace(index=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set user_text = text_of(message.content) | trim %}
        {%- if not (user_text.startswith('<tool_response>') and user_text.endswith('</tool_response>')) %}
            {%- set q.index = loop.index0 %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if q.index < 0 %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set text = text_of(message.content) | trim %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\n' ~ text ~ '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in text %}
            {%- set reasoning = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set text = text.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- if loop.index0 > q.index %}
            {{- '<think>\n' ~ (reasoning | trim) ~ '\n</think>\n\n' }}
        {%- endif %}
        {{- text }}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for call in message.tool_calls %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- if not loop.first %}
                    {{- '\n' }}
                {%- elif text | trim %}
                    {{- '\n\n' }}
                {%- endif %}
                {{- '<tool_call>\n<function=' ~ fn.name ~ '>\n' }}
                {%- if fn.arguments is defined %}
                    {%- for name, value in fn.arguments | items %}
                        {%- if value is mapping or (value is sequence and value is not string) %}
                            {%- set value = value | tojson %}
                        {%- endif %}
                        {{- '<parameter=' ~ name ~ '>\n' ~ (value | string) ~ '\n</parameter>\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.previtem and loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' ~ text ~ '\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}
""".strip()


# Qwen2's pre-tokenizer split (also Qwen3.5's): newlines never merge with the text that follows,
# which is what lets the renderer place mask boundaries right after "<|im_start|>assistant\n".
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# (token, special) in the order of the real vocabulary from 248044 on. The real tokenizer marks
# the tool/think tags as added but not special (they survive skip_special_tokens).
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
]
VOCAB_SIZE = 1536

_COMMANDS = [
    "ls -la /app", "cd /app && cat README.md", "grep -rn 'error' /var/log | head -20",
    "python3 -m pytest -q tests/", "pip install --no-index requests", "mkdir -p /app/out && cp data.csv /app/out/",
    "sed -i 's/foo/bar/g' config.ini", "awk -F, '{print $2}' data.csv | sort | uniq -c", "chmod +x run.sh && ./run.sh",
    "find . -name '*.py' -type f | xargs wc -l", "echo $HOME; export PATH=$PATH:/usr/local/bin", "tar -xzf archive.tar.gz -C /tmp",
    "git status && git diff --stat", "cat > /app/report.txt << 'EOF'", "rm -rf /tmp/build && make -j4", "jq '.items[] | .name' data.json",
    "head -n 5 /etc/os-release", "ps aux | grep nginx", "curl -s http://localhost:8080/health", "systemctl status cron",
    "python3 -c 'import json, sys; print(json.load(sys.stdin))' < input.json", "diff -u expected.txt actual.txt",
    "wc -l /app/logs/*.log", "sort -k2 -n results.tsv > sorted.tsv", "test -f /app/output.txt && echo ok || echo missing",
]
_PROSE = [
    "The previous attempt failed and the environment was not reset.", "Let me check the current state of the files first.",
    "The task is complete: the report is written to the expected path.", "I will fix the configuration and run the tests again.",
    "You are a terminal assistant. Complete the user's task using the bash tool.", "Error: No such file or directory",
    "Permission denied", "command not found", "Traceback (most recent call last):", "All tests passed.",
    "The verifier checks the output file and its contents.", "Each call runs exactly one non-interactive shell command.",
    "Directory and environment variable changes persist across calls.", "exit code 1", "exit code 0",
]


def training_corpus(seed=0, n=4000):
    """A deterministic mix of the kinds of text the tiny tokenizer will see in tests and the demo."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            out.append(rng.choice(_COMMANDS))
        elif kind == 1:
            out.append(" ".join(rng.choice(_PROSE) for _ in range(rng.randint(1, 3))))
        elif kind == 2:
            cmd = rng.choice(_COMMANDS)
            out.append(f"<function=bash>\n<parameter=command>\n{cmd}\n</parameter>\n</function>")
        else:
            out.append(json.dumps({"type": "function", "function": {"name": "bash", "parameters": {
                "type": "object", "properties": {"command": {"type": "string", "description": rng.choice(_PROSE)}},
                "required": ["command"]}}}))
    out.append(CHAT_TEMPLATE)  # so the template's own prose tokenises into few pieces
    return out


def build_tokenizer():
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    # One at a time so ids follow the real order although special and non-special tokens interleave.
    for content, special in ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    return tok


def tokenizer_config():
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": 262144,
        "chat_template": CHAT_TEMPLATE,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tok = build_tokenizer()
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2, ensure_ascii=False)
        f.write("\n")
    ids = {t: tok.token_to_id(t) for t, _ in ADDED_TOKENS}
    print(f"wrote {args.out}: vocab {tok.get_vocab_size()}, <|endoftext|>={ids['<|endoftext|>']}, </think>={ids['</think>']}")


if __name__ == "__main__":
    main()
