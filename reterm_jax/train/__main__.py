"""`python -m reterm_jax.train --config=configs/<mode>.py[:preset] [--workdir=DIR]`: dispatches on
config.mode (the package `reterm_jax.train` holds the loops; this is its command line)."""
import datetime
import os
import shlex
import sys

from absl import flags, logging
from ml_collections import config_flags

from reterm_jax import cli
from reterm_jax.errors import UserError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/sft.py or configs/sft.py:tiny.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, TensorBoard events and the HF export go here "
                               "(default ./runs/<mode>-<timestamp>).")
_SHOW = flags.DEFINE_bool("show_config", False, "Print the resolved config (after the --config.a.b=value overrides), "
                          "one field a line with its doc, and exit without training.")
MODES = {"sft": "reterm_jax.train.sft", "grpo": "reterm_jax.rl.grpo.loop"}
CHECKS = {"sft": "reterm_jax.train.config", "grpo": "reterm_jax.rl.grpo.config"}  # check_config, before JAX starts


def main(argv):
    if len(argv) > 1:
        raise UserError(f"unexpected arguments {argv[1:]}; settings go in --config.a.b=value flags")
    config = _CONFIG.value
    if config is None:
        raise UserError("--config is required, e.g. --config=configs/sft.py")
    mode = config.get("mode")
    if mode not in MODES:
        raise UserError(f"config.mode={mode!r} is not implemented; available modes: {sorted(MODES)}")
    import importlib
    checks = importlib.import_module(CHECKS[mode])
    if _SHOW.value:  # the config as resolved, then its check (a bad field is still one line, exit 2)
        print(cli.describe_config(config, checks.field_docs()), flush=True)
        checks.check_config(config)
        return
    checks.check_config(config)  # the user's typing, before JAX starts
    from reterm_jax.pretrained import resolve_model_path
    config.model.hf_path = resolve_model_path(config.model.hf_path)  # e.g. smollm2: fetched once, then cached
    loop = importlib.import_module(MODES[mode])
    from reterm_jax.cpu_flags import apply_cpu_defaults
    # SFT only: measured faster there; GRPO's time is mostly the sampler's decode, where one
    # run each way was mixed (bench/sampler.py, docs/performance.md)
    added = apply_cpu_defaults() if mode == "sft" else []  # before the backend starts (XLA reads its flags then)
    if added:
        logging.info("XLA flags for CPU training added (RETERM_XLA_CPU_DEFAULTS=0 turns them off): %s",
                     " ".join(added))
    from reterm_jax.parallel.distributed import maybe_initialize
    maybe_initialize()  # before anything touches a device; a no-op on one process
    workdir = _WORKDIR.value or os.path.join(
        "runs", f"{mode}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    logging.info("mode %s, workdir %s", mode, os.path.abspath(workdir))
    result = loop.train(config, workdir)
    for line in summary_lines(result):
        print(line)
    for line in outputs_lines(result, workdir, sys.argv[1:]):
        print(line)


def outputs_lines(result: dict, workdir: str, argv: list[str]) -> list[str]:
    """Where the run's outputs are, and the commands to resume it, evaluate it and look at it (shell-quoted:
    a pasted `--config.env.tasks=DIR/*` must reach the program as a glob, not as the files it matches)."""
    wd = os.path.abspath(workdir)
    args = [a for a in argv if not a.startswith("--workdir")]
    lines = [f"workdir: {wd}", f"  checkpoints: {os.path.join(wd, 'checkpoints')}",
             f"  TensorBoard: {os.path.join(wd, 'tb')}"]
    hf = result.get("hf_dir")
    if hf:
        lines.append(f"  HF export:   {hf}")
    lines += ["to resume (or extend with a larger --config.train.steps): "
              f"python -m reterm_jax.train {shlex.join(args)} --workdir={shlex.quote(wd)}",
              f"to look at the curves: tensorboard --logdir={os.path.join(wd, 'tb')}"]
    if hf:
        lines.append(f"to evaluate it: python -m reterm_jax.evaluate --config=configs/eval.py --tasks=tasks "
                     f"--config.policy=model --config.model.hf_path={hf}")
    return lines


def summary_lines(result: dict) -> list[str]:
    """The end-of-run trend. SFT: loss at the first and last step. GRPO: loss and rollout reward at
    the first and last steps that *updated* the policy (a skipped step, with no group with signal,
    applies nothing, so comparing two of those would say nothing), and how many were skipped."""
    lines = []
    updated = result.get("updated_steps")
    if updated is None:  # SFT
        values = result.get("losses") or {}
        if values:
            first, last = min(values), max(values)
            lines.append(f"loss {values[first]:.4f} (step {first}) -> {values[last]:.4f} (step {last})")
        return lines
    skipped = result.get("skipped_steps") or []
    if updated:
        first, last = updated[0], updated[-1]
        for key, name in (("losses", "loss"), ("rewards", "reward mean")):
            values = result[key]
            lines.append(f"{name} {values[first]:.4f} (first updating step {first}) -> {values[last]:.4f} "
                         f"(last updating step {last})")
    lines.append(f"{len(updated)} steps updated the policy, {len(skipped)} skipped (no group with signal: "
                 f"nothing applied); policy version {result.get('policy_version')}")
    return lines


if __name__ == "__main__":
    cli.run(main)
