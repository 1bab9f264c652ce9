"""The evaluate command's config, typed (reterm_jax/typed_config.py): the run's own fields (policy,
jobs, slots) and its `protocol`, `model`, `sampling`, `limits` and `sandbox` sections, each field's type,
default and doc beside its check. The preset (reterm_jax/presets/eval.py) builds its ConfigDict from
these defaults; `check_config` builds them back once, before any model loads or sandbox starts.
The tiny limits and cache length are GRPO's tiny rollout defaults: a policy is scored under the
limits it trained with.
"""
from __future__ import annotations

import dataclasses
import os

from reterm_jax.errors import UserError
from reterm_jax.rl.evaluation.protocols import PROTOCOLS
from reterm_jax.rl.grpo.config import Rollout
from reterm_jax.sandbox.config import Sandbox
from reterm_jax.typed_config import at_least, build, doc, one_of
from reterm_jax.typed_config import field_docs as docs_of
from reterm_jax.pretrained import MODELS as PRETRAINED

POLICIES = ("model", "oracle", "fault_then_oracle")
PRESET_HINT = "reterm_jax.presets.eval.get_config (configs/eval.py)"


def protocol_names(names: str) -> list[str]:
    """The comma-separated protocol names, checked (a one-line UserError naming what was typed)."""
    protocols = [p.strip() for p in names.split(",") if p.strip()]
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown or not protocols:
        raise UserError(f"--config.protocol.names={names!r}: unknown {unknown}; choose from {', '.join(PROTOCOLS)}")
    return protocols


@dataclasses.dataclass(frozen=True)
class Run:
    policy: str = doc("oracle", "model | oracle | fault_then_oracle")
    jobs: int = doc(2, "trials running at once (each holds one sandbox, plus a verifier clone)")
    slots: int = doc(0, "policy=model: sampler rows the concurrent attempts share (continuous batching; e.g. = "
                        "jobs); 0: one attempt decodes at a time")

    def __post_init__(self):
        one_of("", "policy", self.policy, POLICIES)
        at_least("", self, jobs=1)
        if self.slots < 0:
            raise UserError(f"--config.slots={self.slots}: must be >= 0 (0: one attempt at a time)")


@dataclasses.dataclass(frozen=True)
class Protocol:
    names: str = doc("pass@1,retry@k,recovery@k", "comma-separated subset of the protocols")
    k: int = doc(2, "attempts for Retry@k / Recovery@k")
    n_samples: int = doc(1, "independent trials per task and protocol")

    def __post_init__(self):
        protocol_names(self.names)
        at_least("protocol", self, k=1, n_samples=1)


@dataclasses.dataclass(frozen=True)
class EvalModel:
    preset: str = doc("tiny", "the model's shape without a checkpoint: tiny | qwen3_5_9b | smollm2")
    hf_path: str = doc("", "HF checkpoint dir (weights + tokenizer)")
    checkpoint: str = doc("", "orbax checkpoint (config.json beside it, or the HF dir in hf_path)")
    tokenizer: str = doc("", "tokenizer dir, or 'qwen3.5'; empty: hf_path's own, else the real Qwen3.5 tokenizer "
                             "for a 248k vocabulary, else the bundled tiny one")
    dtype: str = doc("float32", "compute dtype")
    max_length: int = doc(Rollout.cache_length, "sampler cache length per row (GRPO's rollout.cache_length)")

    def __post_init__(self):
        at_least("model", self, max_length=1)


@dataclasses.dataclass(frozen=True)
class Sampling:
    temperature: float = doc(1.0, "sampling temperature")
    top_k: int = doc(0, "0 = off")
    top_p: float = doc(1.0, "1.0 = off")


@dataclasses.dataclass(frozen=True)
class Limits:
    max_turns: int = doc(Rollout.max_turns, "turns per attempt")
    max_tokens: int = doc(Rollout.max_tokens, "an attempt's context in tokens")
    max_new_tokens_per_turn: int = doc(Rollout.max_new_tokens_per_turn, "sampled tokens per turn")
    wall_clock_s: float = doc(Rollout.wall_clock_s, "per attempt; the task's [agent].timeout_sec also caps it")
    command_timeout_s: float = doc(Rollout.command_timeout_s, "per bash call")

    def __post_init__(self):
        at_least("limits", self, max_turns=1, max_tokens=1, max_new_tokens_per_turn=1)
        for name in ("wall_clock_s", "command_timeout_s"):
            if getattr(self, name) <= 0:
                raise UserError(f"--config.limits.{name}={getattr(self, name)}: must be > 0")


SECTIONS = {"protocol": Protocol, "model": EvalModel, "sampling": Sampling, "limits": Limits, "sandbox": Sandbox}
RUN_FIELDS = tuple(f.name for f in dataclasses.fields(Run))


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    run: Run
    protocol: Protocol
    model: EvalModel
    sampling: Sampling
    limits: Limits
    sandbox: Sandbox

    @classmethod
    def of(cls, config) -> EvalConfig:
        """From the command's ConfigDict (the one place the typed config is built)."""
        run = build(Run, "", {k: config[k] for k in RUN_FIELDS if k in config}, PRESET_HINT)
        return cls(run=run, **{name: build(kind, name, config[name], PRESET_HINT) for name, kind in SECTIONS.items()})

    def __post_init__(self):
        if self.run.policy != "model":
            return
        m = self.model
        if m.hf_path and m.hf_path not in PRETRAINED and not os.path.isfile(os.path.join(m.hf_path, "config.json")):
            what = "no such directory" if not os.path.isdir(m.hf_path) else "no config.json in it (not an HF model dir)"
            raise UserError(f"--config.model.hf_path={m.hf_path}: {what}")
        if m.checkpoint and not os.path.isdir(m.checkpoint):
            raise UserError(f"--config.model.checkpoint={m.checkpoint}: no such directory")
        if m.tokenizer and m.tokenizer != "qwen3.5" and not os.path.isfile(os.path.join(m.tokenizer, "tokenizer.json")):
            raise UserError(f"--config.model.tokenizer={m.tokenizer}: no tokenizer.json there (a tokenizer directory, "
                            "or \"qwen3.5\")")
        if not (m.hf_path or m.checkpoint) and m.preset != "tiny":
            raise UserError(f"preset {m.preset}: set --config.model.hf_path or --config.model.checkpoint")


def check_config(config) -> EvalConfig:
    """What the user typed, checked before any model loads or sandbox starts (one-line UserError)."""
    return EvalConfig.of(config)


def field_docs() -> dict[str, str]:
    docs = docs_of(SECTIONS)
    docs.update({f.name: f.metadata.get("doc", "") for f in dataclasses.fields(Run)})
    return docs
