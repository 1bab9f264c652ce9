"""Does ReTerm-GRPO make a model (the tiny one, or SmolLM2: --model) recover better on tasks it never saw?

    python experiments/learning/learning_run.py --out runs/learning [--model tiny|smollm2] [--slots 0]
        [--train 48] [--val 16] [--heldout 64] [--samples 4]
        [--sft_candidates 400,800,1200] [--grpo_steps 20] [--jobs 3] [--families all|NAME,...]
        [--faults_per_task N] [--sft_batch B] [--sft_restart STEPS@LR ...] [--sft_init HF_DIR] [--sft_lr LR]
        [--novel_train N] [--words_train N] [--solve_rows] [--val_split train|novel|words-val] [--grpo_train N]
        [--grpo_split train|novel|words|tokens] [--extra_rows JSONL ...] [--sft_on all|extra]
        [--stop_after_warm_start] [--warm_start HF_DIR] [--start_policy HF_DIR] [--set rollout.group_size=8 ...]

Stages (each one's output is reused when it is there: rerun the same command to resume):
 1. OUT/tasks/{train,val,heldout[,grpo,novel,words]}: generated instances (reterm_jax.tasks). `val` is a
    validation slice of a training split (another seed): train pools, or made-up names
    (--val_split novel); `heldout` alone draws from the held-out pools.
 2. OUT/demos.jsonl: teacher recovery rows of the train instances (reterm_jax.tasks demos), plus
    (--novel_train N) OUT/demos_novel.jsonl of N novel-split instances and (--words_train N)
    OUT/demos_words.jsonl of N words-split ones (English-word names), all in OUT/sft_rows.jsonl
    (--solve_rows: with one first-attempt row per instance, in *_solve.jsonl files; the recovery rows
    of a run that has the files without them are reused: only the oracles run). --extra_rows FILE
    adds rows made elsewhere (e.g. experiments/learning/own_failures.py: the teacher's recoveries from the warm
    start's own failed attempts), all in OUT/sft_rows_extra.jsonl; with --sft_on=extra the SFT and the
    control train on those rows alone (OUT/sft_rows_own.jsonl) while the rollout limits cover every row.
 3. OUT/sft: configs/sft.py:<model> on those rows (tiny: from random weights, or --sft_init's; smollm2: from its
    pretrained weights), seq_len = the longest row (none truncated), checkpoints at each --sft_candidates step; each candidate is
    scored on `val` (recovery from the scripted fault, 1 sample per task); by --warm_start_rule
    (signal: the score nearest 0.5 among those that recover; best: the highest), ties to the
    earliest, one is the warm start, exported to OUT/warm_start_hf. Each --sft_restart adds a
    phase (OUT/sft_restart, OUT/sft_restart2, ...) from the previous phase's last weights with a
    new schedule, whose checkpoints are candidates too. The held-out split plays no part in any choice.
    --warm_start HF_DIR skips this stage: an earlier run's warm start (its learning_run_state.json
    says how it was trained; the arguments that make the rows, and the rows, must match) is
    OUT/warm_start_hf. --start_policy HF_DIR skips it too: any exported policy (e.g. an earlier
    run's grpo_hf: a second GRPO round) is OUT/warm_start_hf.
 4. OUT/grpo: configs/grpo.py:<model> from the warm start on the train instances (--grpo_train N:
    on N other instances of --grpo_split, OUT/tasks/grpo, that no demonstration showed); failure
    bank from their scripted faults, rollout limits covering the longest demonstration -> OUT/grpo_hf.
 5. OUT/control: continued SFT from the warm start on the same rows for as many loss tokens as
    GRPO's updates trained on, at GRPO's LR (compute-matched control) -> OUT/control_hf.
 6. Held-out evaluation of the three HF dirs with the same per-trial keys: pass@1, retry@2 and
    recovery@2 (the headline) from one shared first attempt per sample, and fault-recovery (the
    model's attempt after the task's scripted failed attempt), --samples each.
 7. OUT/result.json and OUT/learning.png (experiments/learning/learning_report.py).
Any HF dir it leaves scores other instances too: `python -m reterm_jax.evaluate
--config.model.hf_path=OUT/grpo_hf --config.tasks='DIR/*'`. Needs Docker; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "configs")]  # runnable from a checkout

from absl import logging  # noqa: E402

import grpo as grpo_config  # noqa: E402  (configs/grpo.py)
import sft as sft_config  # noqa: E402  (configs/sft.py)
from learning_data import demo_limits, extra_rows, fit_slice, make_tasks, sft_rows, steps_for_tokens  # noqa: E402  (experiments/learning/)
from learning_data import log as _log  # noqa: E402
from learning_eval import FAULT_RECOVERY, apply_limits, apply_sets, evaluate, model_policy, parse_protocols, parse_sampling, time_split  # noqa: E402  (experiments/learning/)
import learning_report  # noqa: E402


# ---- stages 3-5: warm start, GRPO, control ----------------------------------------------------------------
def _hf_from_step(ckpt_dir: Path, step: int, out_dir: Path, tokenizer_dir: str) -> None:
    from reterm_jax.convert import restore_model
    from reterm_jax.model.hf_io import save_pretrained
    from reterm_jax.train.run_files import copy_tokenizer_files
    save_pretrained(restore_model(str(ckpt_dir / str(step)), config_dir=str(ckpt_dir)), str(out_dir))
    copy_tokenizer_files(tokenizer_dir, str(out_dir))


MODELS = ("tiny", "smollm2")


def tokenizer_dir(model: str) -> str:
    """The model's tokenizer: the tiny one, or the pretrained model's own (fetched on first use)."""
    from reterm_jax.data.tokenizer import TINY_TOKENIZER_DIR
    from reterm_jax.pretrained import resolve_model_path
    return TINY_TOKENIZER_DIR if model == "tiny" else resolve_model_path(model)


def sft_preset(model: str):
    """configs/sft.py's preset of the model, model.hf_path resolved to the fetched directory."""
    cfg = sft_config.get_config(model)
    if model != "tiny":
        cfg.model.hf_path = cfg.data.tokenizer = tokenizer_dir(model)
    return cfg


def grpo_preset(model: str):
    """configs/grpo.py's preset of the model; the warm start always comes from this run's SFT."""
    cfg = grpo_config.get_config(model)
    if model != "tiny":
        cfg.model.hf_path = tokenizer_dir(model)
        cfg.init.sft_from_hf = False  # init.checkpoint = OUT/warm_start_hf
    return cfg


RESTART_WARMUP, RESTART_END_RATIO = 20, 0.3  # each restart phase's schedule (--sft_restart)


def _sft_phase(out: Path, args, limits: dict, demos: Path, state: dict, save, *, init: Path | None = None,
               phase: int = 0) -> None:
    """One SFT run: the first phase from random weights to the last --sft_candidates step, or (init
    given) the phase-th --sft_restart phase from the previous phase's last weights with fresh Adam
    moments and a new warmup + cosine schedule: a warm restart, another pass over the rows in
    another order."""
    from reterm_jax.train import sft
    cfg = sft_preset(args.model)
    cfg.data.path, cfg.data.seq_len, cfg.data.overlong = str(demos), limits["sft_seq_len"], "drop"
    cfg.train.export_hf, cfg.train.log_every, cfg.train.batch_size = False, 50, args.sft_batch
    if init is None:
        steps = sorted(int(c) for c in args.sft_candidates.split(","))
        cfg.seed, name = args.seed, "sft"
        if args.sft_init:  # fine-tune given weights (fresh Adam) instead of training from random ones
            cfg.model.hf_path, cfg.data.tokenizer = args.sft_init, args.sft_init
        cfg.optim.lr = args.sft_lr or cfg.optim.lr
    else:
        steps, lr = learning_report.parse_restart(args.sft_restart[phase - 1])
        # another row order per phase (seed + 2 is the control's)
        cfg.seed, name = args.seed + (1 if phase == 1 else 1 + phase), learning_report.restart_phase(phase)
        cfg.model.hf_path, cfg.data.tokenizer = str(init), str(init)
        cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.end_lr_ratio = lr, RESTART_WARMUP, RESTART_END_RATIO
    cfg.train.steps = steps[-1]
    every = math.gcd(*steps)
    cfg.checkpoint.every, cfg.checkpoint.keep = every, steps[-1] // every + 1
    t0 = time.time()
    res = sft.train(cfg, str(out / name))
    entry = {"steps": steps[-1], "batch_size": cfg.train.batch_size, "seq_len": cfg.data.seq_len,
             "target_tokens": res["target_tokens"], "train_s": round(time.time() - t0),
             "loss": {s: res["losses"][s] for s in steps if s in res["losses"]}, "lr": cfg.optim.lr}
    if init is None:
        state["sft"] = {**entry, "init": args.sft_init or None, "rows": str(demos)}
    else:
        state["sft"]["restarts"].append({**entry, "lr": cfg.optim.lr, "warmup_steps": RESTART_WARMUP,
                                         "end_lr_ratio": RESTART_END_RATIO, "seed": cfg.seed})
    _log(f"{name}: {steps[-1]} steps in {entry['train_s']} s; losses at the candidates {entry['loss']}")
    save()  # a rerun must not redo (or lose the token count of) a finished SFT


def warm_start(out: Path, args, limits: dict, demos: Path, dirs: dict, gcfg, state: dict, save) -> Path:
    """SFT to the largest candidate step (once), then any warm-restarted
    phases (--sft_restart, each from the previous phase's last weights), then each candidate not
    yet scored is scored on the validation slice and, to break ties, on a slice of the train
    instances it learned from; the one --warm_start_rule picks is exported."""
    from reterm_jax.convert import restore_model
    hf = out / "warm_start_hf"
    first = sorted(int(c) for c in args.sft_candidates.split(","))
    restarts = [learning_report.parse_restart(spec) for spec in args.sft_restart]
    cands = learning_report.candidate_steps(first, *(offsets for offsets, _ in restarts))
    if "restart" in state.get("sft", {}):  # a run from before several restart phases existed
        state["sft"]["restarts"] = [state["sft"].pop("restart")]
    if "target_tokens" not in state.get("sft", {}):
        _sft_phase(out, args, limits, demos, state, save)
    elif (state["sft"].get("init") or "") != args.sft_init:
        sys.exit(f"--sft_init={args.sft_init!r}, but OUT/sft started from {state['sft'].get('init') or 'random weights'!r}: "
                 "use the same --sft_init, or a new --out")
    elif state["sft"].get("rows", str(demos)) != str(demos):
        sys.exit(f"--sft_on={args.sft_on}: the SFT would train on {demos}, but OUT/sft trained on {state['sft']['rows']}: "
                 "use the run's --sft_on and --extra_rows, or a new --out")
    if state["sft"].get("val_split", "train") != args.val_split:  # scored on another slice: score again
        for key in ("val_scores", "fit_scores"):
            state["sft"].pop(key, None)
    done = state["sft"].setdefault("restarts", [])
    if len(done) > len(restarts) or any(d["steps"] != max(offsets) or d["lr"] != lr
                                        for d, (offsets, lr) in zip(done, restarts)):
        ran = ", ".join(f"{d['steps']} steps at peak LR {d['lr']:g}" for d in done) or "none"
        sys.exit(f"--sft_restart {' '.join(args.sft_restart) or '(none)'} does not extend the restart phases OUT/sft "
                 f"ran ({ran}): repeat those, in order, then add new ones; or use a new --out")
    for k in range(len(done) + 1, len(restarts) + 1):
        init = out / f"{learning_report.restart_phase(k)}_init"
        if not init.exists():  # from the previous phase's last checkpoint
            prev, last = ("sft", first[-1]) if k == 1 else (learning_report.restart_phase(k - 1), max(restarts[k - 2][0]))
            _hf_from_step(out / prev / "checkpoints", last, init, tokenizer_dir(args.model))
        _sft_phase(out, args, limits, demos, state, save, init=init, phase=k)
    val_scores = {int(k): v for k, v in state["sft"].get("val_scores", {}).items()}
    fit_scores = {int(k): v for k, v in state["sft"].get("fit_scores", {}).items()}
    todo = [step for step in sorted(cands) if step not in val_scores or step not in fit_scores]
    rescored = bool(todo)
    if rescored:  # the candidates not yet scored (a phase added to a scored run: its own only)
        fit = fit_slice(dirs["train"], dirs["val"])
        for step in todo:
            phase, local = cands[step]
            ckpt = out / phase / "checkpoints"
            policy = model_policy(gcfg, model=restore_model(str(ckpt / str(local)), config_dir=str(ckpt)),
                                  tokenizer_dir=tokenizer_dir(args.model), slots=args.slots)
            for name, tasks, scores in (("validation", dirs["val"], val_scores), ("train fit", fit, fit_scores)):
                summary, _ = evaluate(policy, tasks, samples=1, jobs=args.jobs, protocols=(FAULT_RECOVERY,))
                scores[step] = summary[FAULT_RECOVERY]["score"]
                _log(f"{name} ({len(tasks)} tasks): SFT step {step}: fault-recovery {scores[step]:.3f}")
            policy.close()
            state["sft"].update(val_scores=val_scores, fit_scores=fit_scores, val_split=args.val_split)
            save()  # a candidate's scores survive an interrupted run
    if rescored or state["sft"].get("chosen_step") is None or state["sft"].get("rule", "best") != args.warm_start_rule:
        only = lambda d: {k: v for k, v in d.items() if k in cands}  # noqa: E731 - phases given now
        chosen = learning_report.pick_warm_start(only(val_scores), only(fit_scores), rule=args.warm_start_rule)
        if state["sft"].get("chosen_step") is not None and int(state["sft"]["chosen_step"]) != chosen:
            later = [k for k in ("grpo", "control") if k in state]
            if later:  # they started from the other warm start: never mix the two
                sys.exit(f"--warm_start_rule={args.warm_start_rule} picks SFT step {chosen}, but {' and '.join(later)} "
                         f"ran from step {state['sft']['chosen_step']} (rule {state['sft'].get('rule', 'best')}): "
                         f"use that rule, or a new --out")
            shutil.rmtree(hf, ignore_errors=True)  # picked by another rule: export the new choice
        state["sft"].update(chosen_step=chosen, rule=args.warm_start_rule)
        _log(f"warm start: SFT step {chosen} (rule {args.warm_start_rule}; validation {state['sft']['val_scores']})")
    if not hf.exists():
        phase, local = cands[int(state["sft"]["chosen_step"])]
        _hf_from_step(out / phase / "checkpoints", local, hf, tokenizer_dir(args.model))
    return hf


# The arguments that decide the SFT rows (the control continues the warm start's SFT on them).
SAME_ROWS = ("model", "families", "train", "novel_train", "words_train", "solve_rows", "faults_per_task", "seed", "sft_on")
# arguments newer than a saved run: the value the run had
_ABSENT = {"model": "tiny", "words_train": 0, "solve_rows": False, "sft_on": "all"}


def check_warm_start_args(args) -> None:
    """--warm_start: exit with one line, before any task is made, if the rows would differ."""
    theirs, ours = json.load(open(Path(args.warm_start) / "learning_run_state.json"))["config"]["args"], vars(args)
    had = {k: theirs.get(k, _ABSENT.get(k)) for k in SAME_ROWS}
    diff = [f"--{k}={ours.get(k)!r} (it had {had[k]!r})" for k in SAME_ROWS if had[k] != ours.get(k)]
    if diff:
        sys.exit(f"--warm_start={args.warm_start}: trained on rows made with other arguments: {', '.join(diff)}; "
                 "pass those of the run that made it")


def import_warm_start(out: Path, args, limits: dict, state: dict, save) -> Path:
    """--warm_start: an earlier run's exported warm start (with the learning_run_state.json it was
    saved with) becomes OUT/warm_start_hf, and its SFT record the state's, so GRPO and the
    control start from it without the SFT. The rows in OUT must be the ones it was trained on."""
    src, hf = Path(args.warm_start), out / "warm_start_hf"
    saved = json.load(open(src / "learning_run_state.json"))
    for key in ("rows", "longest_row", "target_tokens"):
        if saved["config"]["limits"][key] != limits[key]:
            sys.exit(f"--warm_start={args.warm_start}: its SFT rows had {key} {saved['config']['limits'][key]}, "
                     f"OUT/sft_rows.jsonl has {limits[key]}: the same arguments made other rows (a changed generator?)")
    if state.get("sft", {}).get("imported_from") not in (None, str(src.absolute())):
        sys.exit(f"--warm_start={args.warm_start}: OUT already started from {state['sft']['imported_from']}; use a new --out")
    if "sft" not in state:
        state["sft"] = {**saved["sft"], "imported_from": str(src.absolute())}
        save()
    if not hf.exists():
        shutil.copytree(src, hf)
    _log(f"warm start: {src} (SFT step {state['sft']['chosen_step']}, rule {state['sft']['rule']})")
    return hf


def import_start_policy(out: Path, args, state: dict, save) -> Path:
    """--start_policy: any exported policy (e.g. an earlier run's grpo_hf, for a second GRPO round)
    becomes OUT/warm_start_hf with no SFT; the control continues from it on this run's rows."""
    src, hf = Path(args.start_policy).absolute(), out / "warm_start_hf"
    if state.get("sft", {}).get("start_policy", str(src)) != str(src) or "chosen_step" in state.get("sft", {}):
        was = state["sft"].get("start_policy") or f"SFT step {state['sft']['chosen_step']}"
        sys.exit(f"--start_policy={args.start_policy}: OUT already started from {was}; use a new --out")
    if "sft" not in state:
        state["sft"] = {"start_policy": str(src), "steps": 0, "batch_size": args.sft_batch, "target_tokens": 0.0}
        save()
    if not hf.exists():
        shutil.copytree(src, hf)
    _log(f"warm start: {src} (--start_policy: no SFT)")
    return hf


def run_grpo(out: Path, gcfg, warm: Path, state: dict) -> Path:
    from reterm_jax.rl.grpo import loop as grpo
    hf = out / "grpo_hf"
    if hf.exists() and "grpo" in state:
        return hf
    gcfg.init.checkpoint = str(warm)
    t0 = time.time()
    res = grpo.train(gcfg, str(out / "grpo"))
    rewards = res["rewards"]
    state["grpo"] = {"steps": gcfg.train.steps, "reward": [rewards[s] for s in sorted(rewards)],
                     "updated_steps": res["updated_steps"], "skipped_steps": res["skipped_steps"],
                     "target_tokens": res["target_tokens"], "train_s": round(time.time() - t0)}
    _log(f"GRPO: {gcfg.train.steps} steps in {state['grpo']['train_s']} s, {len(res['updated_steps'])} updated; "
         f"reward per step {[round(r, 2) for r in state['grpo']['reward']]}")
    shutil.copytree(res["hf_dir"], hf, dirs_exist_ok=True)
    return hf


def _warm_start_lr(state: dict) -> float:
    """The learning rate of the SFT schedule at the warm start's step (the control continues at it)."""
    import ml_collections

    from reterm_jax.train.optimizer import lr_schedule
    chosen = int(state["sft"]["chosen_step"])
    base = sft_config.get_config(state["config"]["args"].get("model", "tiny")).optim
    opt = dict(lr=state["sft"].get("lr", base.lr), warmup_steps=base.warmup_steps, end_lr_ratio=base.end_lr_ratio,
               decay_steps=state["sft"]["steps"])
    step, end = chosen, state["sft"]["steps"]
    for phase in state["sft"].get("restarts", []):  # the phase the chosen step belongs to
        if chosen <= end:
            break
        opt = dict(lr=phase["lr"], warmup_steps=phase["warmup_steps"], end_lr_ratio=phase["end_lr_ratio"],
                   decay_steps=phase["steps"])
        step, end = chosen - end, end + phase["steps"]
    return float(lr_schedule(ml_collections.ConfigDict(opt))(step))


def run_control(out: Path, args, limits: dict, demos: Path, warm: Path, state: dict, grpo_lr: float) -> Path:
    """Continued SFT from the warm start for GRPO's loss-token count, at GRPO's constant LR
    (--control_lr grpo) or at the LR the SFT schedule had at the warm start's step (sft)."""
    from reterm_jax.train import sft
    hf = out / "control_hf"
    if hf.exists() and "control" in state:
        return hf
    cfg = sft_preset(args.model)
    cfg.seed = args.seed + 2  # another pass over the rows, in neither SFT phase's order
    cfg.train.batch_size = state["sft"].get("batch_size", 1)  # per_step counts the warm start's batches
    if state["sft"]["steps"]:
        per_step = state["sft"]["target_tokens"] / state["sft"]["steps"]
        steps = int(round(state["grpo"]["target_tokens"] / per_step)) if per_step else 0
    elif state["grpo"]["target_tokens"]:  # --start_policy: no SFT to measure a step by; count the control's batches
        steps, _ = steps_for_tokens(demos, str(warm), seq_len=limits["sft_seq_len"], batch_size=cfg.train.batch_size,
                                    seed=cfg.seed, target_tokens=state["grpo"]["target_tokens"])
    else:
        steps = 0
    if steps == 0:  # GRPO applied no update: the compute-matched control is the warm start itself
        shutil.copytree(warm, hf, dirs_exist_ok=True)
        state["control"] = {"steps": 0, "target_tokens": 0.0}
        return hf
    cfg.model.hf_path, cfg.data.tokenizer = str(warm), str(warm)
    cfg.data.path, cfg.data.seq_len, cfg.data.overlong = str(demos), limits["sft_seq_len"], "drop"
    cfg.train.steps, cfg.train.log_every = steps, 10
    lr = grpo_lr if args.control_lr == "grpo" else _warm_start_lr(state)
    cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.end_lr_ratio = lr, 0, 1.0
    cfg.checkpoint.every = steps
    res = sft.train(cfg, str(out / "control"))
    state["control"] = {"steps": steps, "target_tokens": res["target_tokens"], "lr": cfg.optim.lr,
                        "lr_from": args.control_lr}
    shutil.copytree(res["hf_dir"], hf, dirs_exist_ok=True)
    _log(f"control: {steps} continued-SFT steps, {res['target_tokens']:.0f} loss tokens "
         f"(GRPO: {state['grpo']['target_tokens']:.0f})")
    return hf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/learning")
    p.add_argument("--model", default="tiny", choices=MODELS,
                   help="tiny: the from-scratch tiny model (runs 1-39); smollm2: SmolLM2-135M-Instruct (fetched and "
                        "converted once, docs/pretrained.md), fine-tuned with its presets (top 10 layers train)")
    p.add_argument("--train", type=int, default=48, help="train-split instances (GRPO tasks and demonstrations)")
    p.add_argument("--val", type=int, default=16, help="validation instances (train split, another seed)")
    p.add_argument("--heldout", type=int, default=64, help="held-out instances to evaluate on")
    p.add_argument("--samples", type=int, default=4, help="evaluation samples per held-out task and protocol")
    p.add_argument("--protocols", default=f"shared,{FAULT_RECOVERY}",
                   help=f"shared (pass@1, retry@2, recovery@2 from one first attempt) and/or {FAULT_RECOVERY}")
    p.add_argument("--sft_candidates", default="400,800,1200", help="SFT steps scored on the validation slice")
    p.add_argument("--sft_init", default="", metavar="HF_DIR",
                   help="start the SFT from these weights (fresh Adam) instead of random ones, e.g. an earlier "
                        "run's OUT/warm_start_hf (run 7: run 6's step 6,000)")
    p.add_argument("--sft_lr", type=float, default=0.0,
                   help="the SFT's peak LR (0 = configs/sft.py:tiny's); warmup and cosine as there")
    p.add_argument("--novel_train", type=int, default=0,
                   help="add the demonstrations of this many novel-split instances (made-up names, seed + 3000) "
                        "to the SFT rows: rows only copying the names gets right")
    p.add_argument("--words_train", type=int, default=0,
                   help="add the demonstrations of this many words-split instances (names made of English words, "
                        "seed + 4000) to the SFT rows: the tokens real names are made of (run 14: held-out hosts' "
                        "tokens were rare in syllable rows)")
    p.add_argument("--solve_rows", action="store_true",
                   help="add one first-attempt row per demonstrated instance (the oracle from the clean state, "
                        "trained on as attempt 1): recovery rows never train the first attempt that pass@1 and "
                        "recovery@2 start from (run 15: 58%% of the warm start's first attempts never closed a turn)")
    p.add_argument("--extra_rows", action="append", default=[], metavar="JSONL",
                   help="more SFT rows (repeatable), e.g. the teacher's recoveries from the warm start's own failures "
                        "(experiments/learning/own_failures.py --rows, reterm_jax/tasks/bank_demos.py), joined after the "
                        "demonstrations in OUT/sft_rows_extra.jsonl; train-split tasks only")
    p.add_argument("--sft_on", default="all", choices=("all", "extra"),
                   help="the rows the SFT and the control train on: all (the demonstrations and --extra_rows) or "
                        "extra (--extra_rows only, e.g. a round of own-failure rows fine-tuned into an earlier policy "
                        "without retraining the rows it has learned: run 19 lost run 18's gain that way); the "
                        "rollout limits still cover every row")
    p.add_argument("--val_split", default="train", choices=("train", "novel", "words-val"),
                   help="the validation slice's split: train (train-pool names), novel (made-up names the "
                        "model never saw: measures copying, as held-out names need, without the held-out pools) "
                        "or words-val (English words no SFT row has: real names' tokens, as held-out's)")
    p.add_argument("--sft_batch", type=int, default=1,
                   help="packed rows per SFT step (run 3: 4 rows a step start copying the instance's values, 1 does not)")
    p.add_argument("--sft_restart", action="append", default=[], metavar="STEPS@LR",
                   help="a further SFT phase after the previous one's last step (repeatable; the first after the "
                        f"last candidate): from its weights, fresh Adam, {RESTART_WARMUP} warmup steps to this peak "
                        f"LR, cosine to {RESTART_END_RATIO}x; its checkpoints at these steps (counted on from the "
                        "previous phase) are candidates too, e.g. 1500,3000@1e-3 (run 6: where the tiny model "
                        "learned to copy ports); give the phases a run already has again, in order, to add one")
    p.add_argument("--warm_start_rule", default="signal", choices=learning_report.WARM_START_RULES,
                   help="which SFT candidate starts GRPO, by its validation score: signal = nearest 0.5 among "
                        "those that recover (GRPO's groups then disagree), best = the highest")
    p.add_argument("--grpo_steps", type=int, default=20)
    p.add_argument("--grpo_train", type=int, default=0,
                   help="GRPO on this many train-split instances (seed + 2000) that no demonstration showed, "
                        "not on the SFT's own (run 6: a warm start that memorised those passes 4/4 in "
                        "nearly every group: no signal); 0 = the SFT's train instances")
    p.add_argument("--grpo_split", default="train", choices=("train", "novel", "words", "tokens"),
                   help="the split of the --grpo_train instances: train (train-pool names), novel (made-up "
                        "names: only copying passes them, as on held-out instances), words (English-word names) "
                        "or tokens (names of the tokenizer's own tokens, every one of them: run 32)")
    p.add_argument("--families", default="all",
                   help="task families of every split (comma-separated names, or all); fix it before the run, "
                        "never from held-out scores")
    p.add_argument("--faults_per_task", type=int, default=0,
                   help="demonstrations of this many fault kinds per train instance (0 = all): more instances, "
                        "more distinct values, for the same Docker time")
    p.add_argument("--control_lr", default="grpo", choices=("grpo", "sft"),
                   help="the control's constant LR: GRPO's (optim.lr: the same Adam steps on other data; run 14: "
                        "one Adam step at 5e-4 undid this warm start's recoveries) or the SFT schedule's at the "
                        "warm start's step (runs 1-13)")
    p.add_argument("--warm_start", default="", metavar="HF_DIR",
                   help="skip the SFT: start GRPO and the control from this earlier run's warm start (a "
                        "warm_start_hf with its learning_run_state.json, e.g. experiments/learning/results/run13_warm_start_hf); "
                        "give the arguments that run had")
    p.add_argument("--start_policy", default="", metavar="HF_DIR",
                   help="skip the SFT: start GRPO and the control from this exported policy (e.g. an earlier run's "
                        "grpo_hf, for a second GRPO round: experiments/learning/results/run18_grpo_hf); the control continues SFT "
                        "from it on this run's rows (--sft_on) for GRPO's loss tokens at GRPO's LR")
    p.add_argument("--stop_after_warm_start", action="store_true",
                   help="stop after the warm start is chosen (tasks, demos, SFT, validation)")
    p.add_argument("--eval_sampling", default="rollout", metavar="rollout|T,TOP_K,TOP_P",
                   help="how the held-out evaluation samples: rollout (as GRPO, at its rollout temperature, 1.0) or "
                        "e.g. 0.6,20,0.95 (configs/eval.py's Qwen3.5 setting); an evaluation saved with other "
                        "sampling is run again")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=3, help="trials (and demo tasks) at once")
    p.add_argument("--slots", type=int, default=0,
                   help="scoring: 0 = one model attempt at a time (runs 1-39), N = up to N attempts decode together "
                        "in one batch (continuous batching; the same tokens per trial either way); give --jobs >= N")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configs/grpo.py:tiny field (repeatable)")
    args = p.parse_args()
    logging.set_verbosity(logging.WARNING)
    from reterm_jax.tasks.generate import parse_families
    try:
        parse_families(args.families)
    except ValueError as e:
        sys.exit(str(e))
    if args.grpo_train < 0:
        sys.exit(f"--grpo_train={args.grpo_train}: use 0 (the SFT's train instances) or a positive count")
    if args.sft_init and not os.path.isfile(os.path.join(args.sft_init, "config.json")):
        sys.exit(f"--sft_init={args.sft_init!r}: not an HF model directory (no config.json); pass e.g. OUT/warm_start_hf")
    if args.warm_start and not all(os.path.isfile(os.path.join(args.warm_start, f))
                                   for f in ("config.json", "learning_run_state.json")):
        sys.exit(f"--warm_start={args.warm_start!r}: not a warm start learning_run exported (needs config.json and "
                 "learning_run_state.json), e.g. experiments/learning/results/run13_warm_start_hf")
    try:
        sampling = parse_sampling(args.eval_sampling)
    except ValueError as e:
        sys.exit(str(e))
    if args.warm_start:
        check_warm_start_args(args)
    if args.start_policy:
        if not os.path.isfile(os.path.join(args.start_policy, "config.json")):
            sys.exit(f"--start_policy={args.start_policy!r}: not an HF model directory (no config.json); pass e.g. "
                     "experiments/learning/results/run18_grpo_hf")
        clash = [f for f in ("warm_start", "sft_init", "sft_restart", "stop_after_warm_start") if getattr(args, f)]
        if args.control_lr != "grpo":
            clash.append("control_lr=sft")
        if clash:
            sys.exit(f"--start_policy has no SFT, so --{clash[0]} does not apply: leave it out")
    for flag in ("novel_train", "words_train"):
        if getattr(args, flag) < 0:
            sys.exit(f"--{flag}={getattr(args, flag)}: use 0 (none) or a positive count")
    if args.sft_batch < 1:
        sys.exit(f"--sft_batch={args.sft_batch}: use 1 or more packed rows a step")
    try:
        for spec in args.sft_restart:
            learning_report.parse_restart(spec)
    except ValueError as e:
        sys.exit(str(e))
    if args.sft_on == "extra" and not args.extra_rows:
        sys.exit("--sft_on=extra trains on the --extra_rows rows only: give at least one --extra_rows JSONL")
    missing = [p for p in args.extra_rows if not os.path.isfile(p)]
    if missing:
        sys.exit(f"--extra_rows={missing[0]}: no such file (experiments/learning/own_failures.py --rows writes one)")
    if args.faults_per_task < 0:
        sys.exit(f"--faults_per_task={args.faults_per_task}: use 0 (every fault kind) or a positive count")
    try:
        protocols = parse_protocols(args.protocols)
    except ValueError as e:
        sys.exit(str(e))
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "state.json"
    state = json.load(open(state_path)) if state_path.exists() else {}
    stages = state.setdefault("stages_s", {})

    def save():
        json.dump(state, open(state_path, "w"), indent=1)

    t_all = time.time()
    t0 = time.time()
    dirs = make_tasks(out, args)
    demos = sft_rows(out, dirs, args)
    limits = demo_limits(demos, tokenizer_dir(args.model))
    train_rows, sft_limits = demos, limits  # what the SFT and the control train on
    if args.sft_on == "extra":
        train_rows = extra_rows(out, args)
        sft_limits = {**limits, "sft_seq_len": demo_limits(train_rows, tokenizer_dir(args.model))["sft_seq_len"]}
    stages.setdefault("tasks_and_demos", round(time.time() - t0))
    _log(f"tasks: {', '.join(f'{k} {len(v)}' for k, v in dirs.items())}; demos {limits['rows']} rows, "
         f"longest {limits['longest_row']} tokens -> {limits}")

    gcfg = grpo_preset(args.model)
    gcfg.seed = args.seed
    gcfg.env.tasks = str(out / "tasks" / ("grpo" if args.grpo_train else "train") / "*")
    gcfg.train.steps = args.grpo_steps
    apply_limits(gcfg, limits)
    apply_sets(gcfg, args.set)
    state["config"] = {"grpo": json.loads(gcfg.to_json_best_effort()), "limits": limits, "args": vars(args)}

    first = (lambda: import_warm_start(out, args, limits, state, save)) if args.warm_start else \
        (lambda: import_start_policy(out, args, state, save)) if args.start_policy else \
        (lambda: warm_start(out, args, sft_limits, train_rows, dirs, gcfg, state, save))
    for name, fn in (("warm_start", first),
                     ("grpo", lambda: run_grpo(out, gcfg, out / "warm_start_hf", state)),
                     ("control", lambda: run_control(out, args, sft_limits, train_rows, out / "warm_start_hf", state,
                                                           gcfg.optim.lr))):
        t0 = time.time()
        fn()
        stages.setdefault(name, round(time.time() - t0))
        save()
        if name == "warm_start" and args.stop_after_warm_start:
            _log(f"stopping after the warm start (--stop_after_warm_start): {state['sft']}")
            return

    evals, timing = {}, {}
    # A policy with the warm start's params (GRPO applied no update; a 0-step control) gets the
    # same trials by construction (same params, same per-trial keys): its evaluation is reused.
    same_as_warm = {"grpo": not state["grpo"]["updated_steps"], "control": state["control"]["steps"] == 0}
    for name in learning_report.POLICIES:
        cache = out / f"eval_{name}.json"
        if same_as_warm.get(name):
            evals[name], timing[name] = evals["warm_start"], {"reused": "warm_start (identical params)"}
            _log(f"held-out evaluation of {name}: its params are the warm start's, so are its trials (reused)")
            continue
        saved = json.load(open(cache)) if cache.exists() else None
        if saved is not None and saved.get("sampling", "rollout") == args.eval_sampling:
            evals[name], timing[name] = saved["summary"], saved["time"]
            continue
        t0 = time.time()
        policy = model_policy(gcfg, str(out / f"{name}_hf"), sampling=sampling, slots=args.slots)
        summary, trials = evaluate(policy, dirs["heldout"], samples=args.samples, jobs=args.jobs, protocols=protocols)
        policy.close()
        timing[name] = {**time_split(trials), "wall_s": round(time.time() - t0)}
        evals[name] = summary
        json.dump({"summary": summary, "time": timing[name], "sampling": args.eval_sampling,
                   "trials": [t.to_json() for t in trials]}, open(cache, "w"), indent=1)
        stages[f"eval_{name}"] = timing[name]["wall_s"]
        save()
        _log(f"held-out evaluation of {name}: " + ", ".join(f"{k} {v['score']:.3f}" for k, v in summary.items())
             + f" ({timing[name]})")

    res = learning_report.result(evals, tasks=len(dirs["heldout"]), samples=args.samples,
                                 train_reward=state["grpo"]["reward"], wall_s=round(sum(stages.values())),
                                 extra={"stages_s": stages, "eval_time": timing, "sft": state["sft"],
                                        "grpo": {k: v for k, v in state["grpo"].items() if k != "reward"},
                                        "control": state["control"], "limits": limits,
                                        "eval_sampling": args.eval_sampling, "this_invocation_s": round(time.time() - t_all)})
    json.dump(res, open(out / "result.json", "w"), indent=1)
    try:
        learning_report.plot(res, evals, str(out / "learning.png"))
    except ImportError:
        _log("matplotlib is not installed: no learning.png (pip install matplotlib)")
    held = res["heldout"]
    _log(f"held-out ({held['tasks']} tasks x {held['samples']} samples):")
    for label in evals["warm_start"]:
        cells = "  ".join(f"{pol} {held[pol][label]:.3f}" for pol in learning_report.POLICIES)
        g = held["gains"]["grpo-warm_start"][label]
        _log(f"  {label:<15} {cells}  GRPO - warm start {g['mean']:+.3f} [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}]")
    _log(f"wrote {out / 'result.json'}")


if __name__ == "__main__":
    main()
