"""`python -m reterm_jax.evaluate --config=configs/eval.py[:preset] --tasks=DIR [--out=FILE]`

Pass@1, Retry@k and Recovery@k (reterm_jax.rl.evaluation.protocols) for one policy over a directory of
task dirs (or one task dir). Trials run in parallel on a SandboxPool (`config.jobs`), with a
progress bar; the results JSON (docs/evaluate.md) goes to --out (default <workdir>/results.json)
and a summary table is printed. A task dir that does not load, or whose trials break, is a failed
row of the table, never a crash.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

from absl import flags, logging
from ml_collections import config_flags

from reterm_jax import cli
from reterm_jax.errors import UserError
from reterm_jax.rl.evaluation import protocols as evaluation
from reterm_jax.rl.evaluation.config import check_config, field_docs, protocol_names

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets", "eval.py"),
    "configs/eval.py[:tiny|qwen3_5_9b] (default: the package's eval preset)", lock_config=True)
_TASKS = flags.DEFINE_string("tasks", None, "A directory of task dirs, or one task dir.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default ./runs/eval-<timestamp>).")
_OUT = flags.DEFINE_string("out", None, "Results JSON path (default <workdir>/results.json).")
_BASELINE = flags.DEFINE_string("baseline", None, "Another run's results JSON on the same tasks (e.g. the warm "
                                "start's): also print this policy minus that one per protocol, paired over tasks, "
                                "with a 95% bootstrap interval.")
_SHOW = flags.DEFINE_bool("show_config", False, "Print the resolved config, one field a line with its doc, and exit.")


def task_dirs(path: str) -> list[Path]:
    """One task dir (it has task.toml), or every non-hidden subdirectory: a subdirectory that is
    not a valid task is kept, so that it shows up as a failed row instead of vanishing."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"--tasks={path}: not a directory")
    if (root / "task.toml").is_file():
        return [root]
    found = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise UserError(f"--tasks={path}: no task directories in it")
    return found


def build_model_policy(config):
    """The model policy: weights from an HF dir or an orbax checkpoint, else (tiny preset only) a
    random-initialised tiny model, which exercises the whole path but scores ~0."""
    import jax.numpy as jnp
    from flax import nnx

    from reterm_jax.data import load_tokenizer, special_ids
    from reterm_jax.data.tokenizer import QWEN3_5_VOCAB, resolve_tokenizer
    from reterm_jax.model import Qwen3_5Config
    from reterm_jax.rl.agent.harness import Limits
    from reterm_jax.rl.evaluation.policies import ModelPolicy
    from reterm_jax.rl.inference.sampler import Sampler
    from reterm_jax.rl.inference.sampling import SamplingParams

    m = config.model
    vocab = (Qwen3_5Config.from_hf_dir(m.hf_path).vocab_size if m.hf_path
             else QWEN3_5_VOCAB if m.preset == "qwen3_5_9b" else 0)
    tok = load_tokenizer(resolve_tokenizer(m.tokenizer, m.hf_path, vocab))
    if m.checkpoint:
        from reterm_jax.convert import restore_model
        model = restore_model(m.checkpoint, config_dir=m.hf_path or None)
    elif m.hf_path:
        from reterm_jax.model.hf_io import load_pretrained
        model = load_pretrained(m.hf_path, getattr(jnp, m.dtype))
    elif m.preset == "tiny":
        from reterm_jax.model import Qwen3_5ForCausalLM
        model = Qwen3_5ForCausalLM(Qwen3_5Config.tiny(vocab_size=len(tok)), rngs=nnx.Rngs(config.seed))
    else:
        raise UserError(f"preset {m.preset}: set --config.model.hf_path or --config.model.checkpoint")
    ids = special_ids(tok)
    sampler = Sampler(model, stop_ids=ids.stop, pad_id=ids.pad, max_length=m.max_length)
    return ModelPolicy(sampler, tok, Limits(**config.limits.to_dict()), SamplingParams(**config.sampling.to_dict()),
                       seed=config.seed, slots=int(config.slots))


def make_policy(config):
    from reterm_jax.rl.evaluation import policies
    if config.policy in policies.SCRIPTED:
        return policies.SCRIPTED[config.policy]
    if config.policy == "model":
        return build_model_policy(config)
    raise UserError(f"--config.policy={config.policy!r}: use model, oracle or fault_then_oracle")


def evaluate(config, dirs: list[Path], policy) -> list[evaluation.Trial]:
    """Every (task, protocol, sample) trial on a SandboxPool, in input order."""
    from tqdm import tqdm

    from reterm_jax.sandbox import DockerSandbox, SandboxPool, load_task, verify
    protocols = protocol_names(config.protocol.names)
    jobs = [(d, p, s) for d in dirs for p in protocols for s in range(config.protocol.n_samples)]

    def run(job):
        d, protocol, sample = job
        return evaluation.run_trial(policy, d, protocol, k=config.protocol.k, sample=sample,
                                    sandbox_factory=DockerSandbox.from_task, verify_fn=verify,
                                    load_task_fn=load_task)

    with SandboxPool(max_concurrency=config.jobs) as pool:
        futures = [pool.submit(run, job) for job in jobs]
        with tqdm(total=len(futures), desc=f"eval {config.policy}", unit="trial", file=sys.stderr) as bar:
            for f in futures:
                f.result()
                bar.update()
    trials = []
    for (d, protocol, sample), f in zip(jobs, futures):
        outcome = f.result()
        # run_trial catches everything; an Outcome error is a bug in it, still kept as a row.
        trials.append(outcome.value if outcome.ok else evaluation.Trial(d.name, protocol, sample, error=outcome.error))
    return trials


def load_baseline(path: str) -> dict:
    """A results JSON's summary, checked before anything runs."""
    try:
        return json.loads(Path(path).read_text())["summary"]
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"--baseline={path}: not a results JSON of `python -m reterm_jax.evaluate` "
                        f"({type(e).__name__}: {e})") from None


def main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected arguments {argv[1:]}; settings go in --config.a.b=value flags")
    config = _CONFIG.value
    if _SHOW.value:  # the config as resolved, then its check (a bad field is still one line, exit 2)
        print(cli.describe_config(config, field_docs()), flush=True)
        check_config(config)
        return 0
    if not _TASKS.value:
        raise UserError("--tasks=DIR is required")
    dirs = task_dirs(_TASKS.value)
    check_config(config)
    from reterm_jax.pretrained import resolve_model_path
    config.model.hf_path = resolve_model_path(config.model.hf_path)  # e.g. smollm2: fetched once, then cached
    baseline = load_baseline(_BASELINE.value) if _BASELINE.value else None
    workdir = _WORKDIR.value or os.path.join("runs", f"eval-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    out = Path(_OUT.value or os.path.join(workdir, "results.json"))
    from reterm_jax.sandbox.sandbox import use_config_runtime
    use_config_runtime(config)
    policy = make_policy(config)
    logging.info("policy %s on %d task dirs, protocols %s", config.policy, len(dirs), config.protocol.names)
    try:
        trials = evaluate(config, dirs, policy)
    finally:
        getattr(policy, "close", lambda: None)()
    k = config.protocol.k
    results = {"policy": config.policy, "tasks_dir": os.path.abspath(_TASKS.value), "k": k,
               "n_samples": config.protocol.n_samples, "config": config.to_dict(),
               "summary": evaluation.summarize(trials, k), "trials": [t.to_json() for t in trials]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(evaluation.format_table(trials, k))
    if baseline is not None:
        print(f"\nthis policy vs --baseline={_BASELINE.value} (same tasks; same per-trial sampling keys):")
        print(evaluation.format_comparison(results["summary"], baseline))
    print(f"results: {out.resolve()}")
    broken = sorted({t.task for t in trials if t.error})
    if broken:
        sys.stderr.write(f"error: {len(broken)} of {len(dirs)} tasks could not be evaluated: {', '.join(broken)} "
                         "(the ERROR column says why; `python -m reterm_jax.sandbox check DIR` tests a task)\n")
        return 1
    return 0


if __name__ == "__main__":
    cli.run(main)
