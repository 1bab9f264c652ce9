"""The learning run's policies and evaluation (experiments/learning/learning_run.py): the model through the bash
harness as GRPO samples it, and the held-out / validation protocols on a pool of sandboxes."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from reterm_jax.rl.evaluation import protocols as evaluation

FAULT_RECOVERY = "fault-recovery"


def apply_limits(gcfg, limits: dict) -> None:
    """Set the GRPO config's rollout limits and sequence length from the limits the longest
    demonstration row sets (learning_data.demo_limits; a learning run's state.json keeps them)."""
    r = gcfg.rollout
    r.max_turns, r.max_tokens, r.cache_length = limits["max_turns"], limits["max_tokens"], limits["cache_length"]
    r.max_new_tokens_per_turn = limits.get("max_new_tokens_per_turn", r.max_new_tokens_per_turn)
    gcfg.train.seq_len = limits["grpo_seq_len"]


def apply_sets(cfg, items: list[str]) -> None:
    """--set KEY=VALUE overrides of a configs/grpo.py config (learning_run.py, learning_demo.py)."""
    for item in items:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = cfg
        for name in parents:
            node = node[name]
        if leaf not in node:
            sys.exit(f"--set {item!r}: configs/grpo.py has no field {key!r}")
        node[leaf] = type(node[leaf])(value) if not isinstance(node[leaf], bool) else value.lower() == "true"


def run_config(state: dict):
    """configs/grpo.py's tiny config as a learning run's policies sampled: its seed, the limits its
    rows set and its --set overrides, read from its state.json (bench scripts that score a policy
    "the way the run did" rebuild it here, so a run's --set rollout.max_tokens=... is not lost)."""
    import grpo as grpo_config  # configs/grpo.py; the experiment scripts put configs/ on sys.path
    gcfg = grpo_config.get_config(state["config"]["args"].get("model", "tiny"))
    gcfg.seed = state["config"]["args"].get("seed", 0)
    apply_limits(gcfg, state["config"]["limits"])
    apply_sets(gcfg, state["config"]["args"].get("set") or [])
    return gcfg


def run_state(out, hf_dirs: list[str]) -> dict:
    """A learning run's state.json for a script that scores policies against it, after checking
    that OUT is such a run and each of hf_dirs is an HF model directory (one-line exits)."""
    import json
    import os
    state_path = os.path.join(str(out), "state.json")
    if not os.path.isfile(state_path):
        sys.exit(f"--out={out}: no state.json there; give the directory of a experiments/learning/learning_run.py run")
    for hf in hf_dirs:
        if not os.path.isfile(os.path.join(hf, "config.json")):
            sys.exit(f"--hf={hf}: not an HF model directory (no config.json); pass e.g. OUT/warm_start_hf")
    return json.load(open(state_path))


def parse_protocols(text: str) -> tuple[str, ...]:
    """--protocols: comma-separated `shared` (pass@1, retry@2, recovery@2) and/or fault-recovery."""
    protocols = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in protocols if x not in ("shared", FAULT_RECOVERY)]
    if bad or not protocols:
        raise ValueError(f"--protocols={text!r}: {f'unknown {bad}' if bad else 'names none'}; "
                         f"use shared and/or {FAULT_RECOVERY}")
    return protocols


def parse_sampling(text: str):
    """--eval_sampling: "rollout" (None: as GRPO samples, at its rollout temperature) or
    TEMPERATURE,TOP_K,TOP_P, e.g. 0.6,20,0.95 (configs/eval.py's setting for Qwen3.5)."""
    from reterm_jax.rl.inference.sampling import SamplingParams
    if text == "rollout":
        return None
    try:
        t, k, p = text.split(",")
        return SamplingParams(temperature=float(t), top_k=int(k), top_p=float(p))
    except ValueError as e:
        raise ValueError(f"--eval_sampling={text!r}: use rollout or TEMPERATURE,TOP_K,TOP_P, e.g. 0.6,20,0.95 "
                         f"({e})") from None


def model_policy(gcfg, hf_dir: str = "", *, model=None, seed: int = 12345, sampling=None, tokenizer_dir: str = "",
                 slots: int = 0):
    """The model (an HF dir, or a restored model) through the bash harness, sampled as GRPO
    samples (or with `sampling`, a SamplingParams), under the GRPO rollout limits. The seed is the
    same for every policy: trial keys then depend on (task, sample, attempt) alone
    (rl/evaluation/policies.py::trial_key). The tokenizer: hf_dir's, else tokenizer_dir, else the tiny one.
    slots=0: one attempt at a time; slots=N: up to N attempts decode together in one batch (continuous
    batching, the same tokens per trial either way); close() the policy when done with it."""
    from reterm_jax.data import load_tokenizer, special_ids
    from reterm_jax.data.tokenizer import TINY_TOKENIZER_DIR
    from reterm_jax.model.hf_io import load_pretrained
    from reterm_jax.rl.agent.harness import Limits
    from reterm_jax.rl.evaluation.policies import ModelPolicy
    from reterm_jax.rl.inference.sampler import Sampler
    from reterm_jax.rl.inference.sampling import SamplingParams
    tok = load_tokenizer(hf_dir or tokenizer_dir or TINY_TOKENIZER_DIR)
    ids = special_ids(tok)
    model = model if model is not None else load_pretrained(hf_dir)
    sampler = Sampler(model, stop_ids=ids.stop, pad_id=ids.pad, max_length=gcfg.rollout.cache_length)
    r = gcfg.rollout
    limits = Limits(max_turns=r.max_turns, max_tokens=r.max_tokens, max_new_tokens_per_turn=r.max_new_tokens_per_turn,
                    wall_clock_s=r.wall_clock_s, command_timeout_s=r.command_timeout_s)
    sampling = SamplingParams(temperature=r.temperature) if sampling is None else sampling
    return ModelPolicy(sampler, tok, limits, sampling, seed=seed, slots=slots)


def evaluate(policy, dirs: list[Path], *, samples: int, jobs: int, protocols: tuple[str, ...]) -> tuple[dict, list]:
    """(summary, trials): shared_first_attempt (pass@1, retry@2, recovery@2) and/or fault-recovery,
    `samples` per task, on a SandboxPool of `jobs` sandboxes' worth of trials at once."""
    from reterm_jax.rl.evaluation.policies import fault_then
    from reterm_jax.sandbox import DockerSandbox, SandboxPool, load_task, verify
    kw = dict(sandbox_factory=DockerSandbox.from_task, verify_fn=verify)
    jobs_list = [(d, p, s) for d in dirs for p in protocols for s in range(samples)]

    def run(job):
        d, protocol, sample = job
        task = load_task(d)
        start = time.monotonic()
        if protocol == FAULT_RECOVERY:
            trials = [evaluation.recovery_at_k(fault_then(policy), task, k=2, sample=sample, **kw)]
            trials[0].protocol = FAULT_RECOVERY
        else:
            trials = evaluation.shared_first_attempt(policy, task, sample=sample, **kw)
        for t in trials:
            t.wall_s = time.monotonic() - start
        return trials

    with SandboxPool(max_concurrency=jobs) as pool:
        outcomes = [f.result() for f in [pool.submit(run, job) for job in jobs_list]]
    trials = []
    for (d, protocol, sample), o in zip(jobs_list, outcomes):
        if o.ok:
            trials.extend(o.value)
        else:  # counts as unresolved, the error kept
            names = [FAULT_RECOVERY] if protocol == FAULT_RECOVERY else list(evaluation.PROTOCOLS)
            trials.extend(evaluation.Trial(d.name, p, sample, error=o.error) for p in names)
    summary = evaluation.summarize([t for t in trials if t.protocol != FAULT_RECOVERY], 2)
    fault = [t for t in trials if t.protocol == FAULT_RECOVERY]
    if fault:
        summary[FAULT_RECOVERY] = evaluation.fault_recovery_summary(fault)
    return summary, trials


def time_split(trials: list) -> dict:
    """Where an evaluation's time went, summed over its trials' distinct attempts."""
    seen, policy_s, verify_s, tokens = set(), 0.0, 0.0, 0
    for t in trials:
        for a in t.attempts:
            if id(a) not in seen:  # a shared first attempt counts once
                seen.add(id(a))
                policy_s, verify_s, tokens = policy_s + a.time_s, verify_s + a.verify_s, tokens + a.tokens
    return {"attempts": len(seen), "policy_s": round(policy_s, 1), "verify_s": round(verify_s, 1),
            "sampled_tokens": tokens}
