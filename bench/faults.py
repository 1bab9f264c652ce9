"""Fault drill: each fault a user has hit, injected for real, and what the run did about it.

    python bench/faults.py [--only=checkpoint,engine_restart,killed_sandbox,disk_limit] [--json=FILE]

Needs root (the engine-restart drill stops and restarts dockerd with launch/start_docker.sh) and
the bundled tasks. Prints a markdown table for docs/performance.md: fault, what happened, steps
lost, containers left. The GRPO drills run the tiny model from a random init (no SFT warm start:
the point is the plumbing, not learning), 4 steps, one rollout worker, on two bundled tasks.

- checkpoint: SFT to step 4 (checkpoints 2 and 4), the largest file of step 4's params cut in
  half, rerun to step 6: the run must name step 4, set it aside and resume from step 2.
- engine_restart: dockerd stopped during a GRPO run, restarted 20 s later: no optimizer update
  while it is down (updates = steps that updated; a skipped step applies nothing), the run ends
  normally and leaves no container behind.
- killed_sandbox: `docker kill` of one running sandbox during a GRPO step: one warning naming it,
  counted in sandbox_errors, the run goes on.
- disk_limit: a scripted attempt writes 80 MB in a task with storage_mb=32: ended as disk_limit
  with reward 0, its container stopped.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "configs")]


class Captured(logging.Handler):
    """Keeps (time, level, message) of every record (the run's warnings are the evidence)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[tuple[float, str, str]] = []

    def emit(self, record):
        self.records.append((time.time(), record.levelname, record.getMessage()))

    def matching(self, text: str, level: str | None = None) -> list[str]:
        return [m for _, lv, m in self.records if text in m and (level is None or lv == level)]


def containers_of_this_run() -> list[str]:
    from reterm_jax.sandbox import get_client, labels
    sel = labels.managed_filter(labels.KIND_CONTAINER, **{labels.RUN_ID: labels.run_id()})
    return [c.name for c in get_client().containers.list(all=True, filters=sel)]


def grpo_config(steps: int = 4):
    import grpo
    c = grpo.get_config("tiny")
    c.init.from_scratch = True
    c.env.tasks = os.path.join(ROOT, "tasks", "*")
    c.env.max_tasks = 2
    c.train.steps = steps
    c.train.export_hf = False
    c.rollout.max_turns = 3
    c.rollout.max_new_tokens_per_turn = 48
    c.checkpoint.every = 100
    return c


def drill_checkpoint(tmp: str) -> dict:
    import sft
    from reterm_jax.train.sft import train
    c = sft.get_config("tiny")
    c.train.steps, c.checkpoint.every, c.train.export_hf = 4, 2, False
    c.model.overrides.update(dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
                                  linear_key_head_dim=16, linear_value_head_dim=16))
    workdir = os.path.join(tmp, "sft")
    train(c, workdir)
    files = [p for p in glob.glob(os.path.join(workdir, "checkpoints", "4", "params", "**", "*"), recursive=True)
             if os.path.isfile(p)]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as fh:
        fh.truncate(os.path.getsize(largest) // 2)
    c.train.steps = 6
    out = train(c, workdir)
    aside = glob.glob(os.path.join(workdir, "checkpoints.unreadable", "4-*"))
    resumed_from = min(out["losses"]) - 1
    return {"fault": "latest checkpoint damaged (largest params file of step 4 cut in half)",
            "happened": f"step 4 set aside ({len(aside)} dir in checkpoints.unreadable), resumed from step "
                        f"{resumed_from}, ran to step {out['last_step']}",
            "steps_lost": 4 - resumed_from, "containers_left": 0, "ok": bool(aside) and resumed_from == 2}


def _run_grpo_with(fault, tmp: str, name: str, cap: Captured) -> tuple[dict, float]:
    """Run tiny GRPO in this thread while `fault(stop_event)` runs in another."""
    from reterm_jax.rl.grpo.loop import train
    done = threading.Event()
    t = threading.Thread(target=fault, args=(done,), daemon=True)
    t.start()
    start = time.time()
    try:
        result = train(grpo_config(), os.path.join(tmp, name))
    finally:
        done.set()
        t.join(120)
    return result, time.time() - start


def drill_engine_restart(tmp: str, cap: Captured) -> dict:
    outage: dict = {}

    def fault(done):
        # once the run has sandboxes up (the bank is seeded and groups are rolling), stop the engine
        while not done.is_set() and not containers_of_this_run():
            time.sleep(0.5)
        time.sleep(3)
        if done.is_set():
            return
        outage["down"] = time.time()
        subprocess.run(["pkill", "-TERM", "-x", "dockerd"], check=False)
        for _ in range(60):
            if subprocess.run(["docker", "info"], capture_output=True).returncode:
                break
            time.sleep(0.5)
        time.sleep(20)
        subprocess.run(["bash", os.path.join(ROOT, "launch", "start_docker.sh")], check=True)
        outage["up"] = time.time()

    result, wall = _run_grpo_with(fault, tmp, "engine", cap)
    down, up = outage.get("down", 0), outage.get("up", 0)
    steps_in_outage = [m for t, _, m in cap.records if down <= t <= up and m.startswith("step ")]
    left = containers_of_this_run()
    return {"fault": "Docker engine stopped during GRPO, restarted 20 s later",
            "happened": f"outage {up - down:.0f} s; {len(cap.matching('does not answer'))} wait warning(s), "
                        f"{len(cap.matching('answers again'))} recovery line(s); {len(steps_in_outage)} step line(s) "
                        f"logged during the outage; {len(result['updated_steps'])} steps updated, "
                        f"{len(result['skipped_steps'])} skipped of {result['last_step']}; wall {wall:.0f} s",
            "steps_lost": len(steps_in_outage),
            "containers_left": len(left), "ok": bool(down) and not left}


def drill_killed_sandbox(tmp: str, cap: Captured) -> dict:
    killed: list[str] = []

    def fault(done):
        from reterm_jax.rl.grpo.failure_bank import IMAGE_REPO
        from reterm_jax.sandbox import get_client, labels
        sel = labels.managed_filter(labels.KIND_CONTAINER, **{labels.RUN_ID: labels.run_id()})
        while not done.is_set() and not killed:
            # a recovery attempt: a container branched from a failure-bank image (not a seeding,
            # collection or verifier sandbox)
            for c in get_client().containers.list(filters=sel):
                try:
                    tags = c.image.tags
                except Exception:  # noqa: BLE001 - gone meanwhile
                    continue
                if any(t.startswith(IMAGE_REPO) for t in tags):
                    time.sleep(1)
                    try:
                        get_client().api.kill(c.name)
                        killed.append(c.name)
                    except Exception:  # noqa: BLE001 - it ended meanwhile: try the next
                        continue
                    break
            time.sleep(0.3)

    result, wall = _run_grpo_with(fault, tmp, "killed", cap)
    named = [m for m in cap.matching("lost:", "WARNING") + cap.matching("failed during the attempt", "WARNING")
             if killed and killed[0] in m]
    left = containers_of_this_run()
    return {"fault": "docker kill of one running sandbox during GRPO",
            "happened": f"killed {killed[0] if killed else 'nothing (no sandbox seen)'}; {len(named)} warning(s) "
                        f"naming it; run ended at step {result['last_step']} ({wall:.0f} s)",
            "steps_lost": 0, "containers_left": len(left), "ok": bool(killed) and len(named) == 1 and not left}


def drill_disk_limit(tmp: str, cap: Captured) -> dict:
    import dataclasses

    from reterm_jax.data import load_tokenizer
    from reterm_jax.rl.agent import harness
    from reterm_jax.rl.agent.harness import Limits, bash_call_xml, initial_messages
    from reterm_jax.rl.agent.rollout import run_episodes
    from reterm_jax.sandbox import DockerSandbox, load_task, verify
    from reterm_jax.sandbox.sandbox import Limits as SandboxLimits
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from rl_test_utils import tiny_sampler
    tok = load_tokenizer()
    task = load_task(os.path.join(ROOT, "tasks", "daily-report-append"))
    turns = ["Fill.\n</think>\n\n" + bash_call_xml("head -c 80000000 /dev/zero > /app/fill") + "<|im_end|>",
             "Done.\n</think>\n\nThe task is complete.<|im_end|>"]
    sb = DockerSandbox.from_task(task, limits=dataclasses.replace(SandboxLimits.from_task(task), storage_mb=32))
    try:
        (traj,) = run_episodes(tiny_sampler(tok, max_length=2048), tok, [sb], [initial_messages(task.instruction)],
                               task_ids=[task.name], limits=Limits.tiny(max_new_tokens_per_turn=512),
                               script=lambda r, t: turns[len(t.turns)], verify_fn=verify)
        alive = sb.alive()
    finally:
        sb.close()
    return {"fault": "an attempt writes 80 MB in a task with storage_mb=32",
            "happened": f"end reason {traj.end_reason}, reward {traj.reward}, container running afterwards: {alive}",
            "steps_lost": 0, "containers_left": len(containers_of_this_run()),
            "ok": traj.end_reason == harness.DISK_LIMIT and traj.reward == 0.0 and not alive}


DRILLS = {"checkpoint": drill_checkpoint, "engine_restart": drill_engine_restart,
          "killed_sandbox": drill_killed_sandbox, "disk_limit": drill_disk_limit}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(DRILLS), help="comma-separated drills")
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in DRILLS]
    if unknown:
        ap.error(f"--only: unknown {unknown}; choose from {', '.join(DRILLS)}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.INFO)  # the loops log their steps through absl at INFO
    cap = Captured()
    logging.getLogger().addHandler(cap)
    logging.getLogger().setLevel(logging.INFO)
    rows = []
    tmp = tempfile.mkdtemp(prefix="reterm-faults-")
    try:
        for name in names:
            t0 = time.time()
            fn = DRILLS[name]
            try:
                row = fn(tmp) if name == "checkpoint" else fn(tmp, cap)
            except Exception as e:  # noqa: BLE001 - a drill that crashes is a finding, not the end
                row = {"fault": name, "happened": f"CRASHED: {type(e).__name__}: {e}", "steps_lost": "?",
                       "containers_left": "?", "ok": False}
            row["drill"], row["seconds"] = name, round(time.time() - t0, 1)
            rows.append(row)
            print(f"[{name}] {row}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"fault drill, {datetime.date.today()}, {platform.node()} ({os.cpu_count()} CPUs), "
          f"`python bench/faults.py --only={','.join(names)}`\n")
    print("| fault | what happened | steps lost | containers left | ok | s |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} | {r['happened']} | {r['steps_lost']} | {r['containers_left']} | "
              f"{'yes' if r['ok'] else 'NO'} | {r['seconds']} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
