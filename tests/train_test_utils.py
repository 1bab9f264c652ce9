"""Shared helpers of the train tests: short synthetic ReTerm rows and a small, fast config."""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _call(i: int, command: str) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def short_rows(n: int) -> list[dict]:
    """n valid rows of a few hundred tokens: failed attempt, failure notice, recovery (targets)."""
    rows = []
    for i in range(n):
        messages = [
            {"role": "system", "content": "You are a terminal assistant with a bash tool."},
            {"role": "user", "content": f"Create /tmp/out{i} holding the number {i * 7}."},
            {"role": "assistant", "content": "Writing it.", "tool_calls": [_call(0, f"echo {i} > /tmp/out{i}")]},
            {"role": "tool", "content": "[exit code 0]"},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Your previous attempt failed; the environment was not reset."},
            {"role": "assistant", "content": "Let me check the file.", "tool_calls": [_call(1, f"cat /tmp/out{i}")]},
            {"role": "tool", "content": f"{i}\n[exit code 0]"},
            {"role": "assistant", "content": f"It holds {i}; fixing.",
             "tool_calls": [_call(2, f"echo {i * 7} > /tmp/out{i}")]},
            {"role": "tool", "content": "[exit code 0]"},
            {"role": "assistant", "content": f"/tmp/out{i} now holds {i * 7}."},
        ]
        rows.append({"id": f"task_{i:06d}:{i:016x}", "task_id": f"task_{i:06d}", "messages": messages,
                     "train_from_message_index": 6, "target_attempt_index": 2,
                     "trajectory_sha256": f"{i:064x}"})
    return rows


def write_rows(path: str, n: int = 12) -> str:
    with open(path, "w") as fh:
        for row in short_rows(n):
            fh.write(json.dumps(row) + "\n")
    return path


def small_config(data_path: str, **train):
    """configs/sft.py's tiny preset shrunk further (2 layers: DeltaNet + attention, seq_len 512)."""
    sys.path.insert(0, os.path.join(ROOT, "configs"))
    import sft as sft_config
    c = sft_config.get_config("tiny")
    c.data.path = data_path
    c.data.seq_len = 512
    c.model.overrides.update(dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                  linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
                                  linear_value_head_dim=16))
    c.train.steps, c.train.batch_size, c.train.log_every = 4, 4, 1
    c.optim.warmup_steps, c.optim.lr = 1, 1e-2
    c.checkpoint.every = 2
    for key, value in train.items():
        section, name = key.split("__")
        c[section][name] = value
    return c


def tb_scalars(tb_dir: str) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} from the event files under tb_dir (TFRecord framing: u64 length, u32
    crc, data, u32 crc)."""
    import glob
    import struct

    from tensorboardX.proto.event_pb2 import Event
    out: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                out.setdefault(v.tag, {})[event.step] = v.simple_value
    return out
