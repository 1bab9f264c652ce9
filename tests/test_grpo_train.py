"""The GRPO trainer: the jitted step's accumulation, learning on a synthetic environment with a
known optimum (no Docker: the proof that the sign and the masks are right), and a short run on
real sandboxes that checkpoints and resumes."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from reterm_jax.model.config import Qwen3_5Config
from reterm_jax.model.decoder import Qwen3_5ForCausalLM
from reterm_jax.parallel.mesh import make_mesh
from reterm_jax.rl.inference.sampling import SamplingParams
from reterm_jax.rl.grpo.step import accumulate_grpo_gradients, check_sampling, make_grpo_step
from reterm_jax.train.state import create_train_state, replicated, train_state_shardings
from train_test_utils import ROOT, tb_scalars
from xla_env import with_test_flags

sys.path.insert(0, os.path.join(ROOT, "configs"))


def _loss_cfg(**kw):
    from reterm_jax.rl.grpo.config import Loss
    return Loss(**kw)


def _model_and_batch(b=4, t=24, vocab=64):
    cfg = Qwen3_5Config.tiny(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             layer_types=("linear_attention", "full_attention"))
    graphdef, params = nnx.split(Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (b, t)).astype(np.int32)
    seg = np.ones((b, t), np.int32)
    for r in range(b):
        seg[r, t - 3 * r:] = 0  # padding of varying length
    pos = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy()
    targets = np.roll(tokens, -1, axis=1)
    # sampled tokens: a different number per row (so per-slice token means differ)
    mask = ((rng.random((b, t)) < 0.5) & (seg != 0) & (np.roll(seg, -1, axis=1) != 0)).astype(np.float32)
    mask[:, -1] = 0
    batch = {"tokens": tokens, "positions": pos, "segment_ids": seg, "targets": targets, "loss_mask": mask,
             # sampler log-probs near the model's (ratios on both sides of the clip range)
             "old_logprobs": (np.log(1.0 / vocab) + rng.normal(0, 0.4, (b, t))).astype(np.float32) * mask,
             "advantages": np.repeat(rng.normal(0, 1, (b, 1)), t, axis=1).astype(np.float32),
             "weights": np.array([1.0, 0.5, 1.0, 0.0][:b], np.float32)}
    return graphdef, nnx.to_pure_dict(params), {k: jnp.asarray(v) for k, v in batch.items()}


def test_check_sampling_rejects_truncated_distributions():
    check_sampling(1.0, 0, 1.0)
    for bad in ((0.0, 0, 1.0), (1.0, 20, 1.0), (1.0, 0, 0.95)):
        with pytest.raises(ValueError, match="GRPO"):
            check_sampling(*bad)


def test_micro_batches_give_the_same_loss_and_grads(kl_coef=0.1):
    """With the KL term on (the reference forward included); the step test covers kl_coef=0."""
    graphdef, params, batch = _model_and_batch()
    mesh = make_mesh()
    ref = jax.tree.map(lambda x: x + 0.01, params) if kl_coef else None
    sampling = SamplingParams(temperature=0.8)

    @jax.jit
    def run1(p, b, r):
        return accumulate_grpo_gradients(graphdef, p, b, r, micro_batches=1, mesh=mesh, sampling=sampling,
                                         loss_cfg=_loss_cfg(kl_coef=kl_coef))

    @jax.jit
    def run2(p, b, r):
        return accumulate_grpo_gradients(graphdef, p, b, r, micro_batches=2, mesh=mesh, sampling=sampling,
                                         loss_cfg=_loss_cfg(kl_coef=kl_coef))

    g1, s1, c1, m1 = run1(params, batch, ref)
    g2, s2, c2, m2 = run2(params, batch, ref)
    assert float(c1) == float(c2) == float(batch["loss_mask"].sum())
    np.testing.assert_allclose(float(s1), float(s2), rtol=1e-5, atol=1e-6)
    for k in m1:
        np.testing.assert_allclose(float(m1[k]), float(m2[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert float(m1["clipped"]) > 0  # the batch exercises the clip
    assert float(m1["kl"]) > 0
    assert sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(g1)) > 0


def test_grpo_step_updates_state_and_reports_metrics():
    import optax
    graphdef, params, batch = _model_and_batch()
    mesh = make_mesh()
    tx = optax.adam(1e-3)
    schedule = optax.constant_schedule(1e-3)
    param_sh = jax.tree.map(lambda _: replicated(mesh), params)
    shardings = train_state_shardings(tx, params, param_sh, mesh)
    state = create_train_state(params, tx, shardings, seed=0)
    before = jax.tree.map(np.asarray, state.params)
    step = make_grpo_step(graphdef, tx, schedule, micro_batches=2, mesh=mesh, shardings=shardings,
                          sampling_temperature=1.0, loss_cfg=_loss_cfg())
    state, metrics = step(state, batch, None)
    assert int(state.step) == 1
    for key in ("loss", "grad_norm", "clip_frac", "clip_frac_low", "clip_frac_high", "kl", "entropy",
                "logprob_diff", "ratio_mean", "target_tokens", "lr"):
        assert np.isfinite(float(metrics[key])), key
    assert 0 < float(metrics["entropy"]) <= np.log(64) + 1e-4
    assert float(metrics["kl"]) == 0.0
    assert any(not np.allclose(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(before),
                                                                 jax.tree.leaves(state.params)))


# ---- the synthetic environment: GRPO must raise the reward --------------------------------------------
def _small_model(c, **extra):
    c.model.overrides.update(dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
                                  linear_key_head_dim=16, linear_value_head_dim=16, **extra))


def synthetic_config(steps: int):
    """A 16-token vocabulary, prompt [3 1 4 1 5], target [7 7 2 9]: a random policy scores ~1/16."""
    import grpo as grpo_config
    c = grpo_config.get_config("tiny")
    c.env.kind = "synthetic"
    c.init.from_scratch = True
    _small_model(c, vocab_size=16, pad_token_id=0, eos_token_id=0)
    c.env.synthetic_prompt, c.env.synthetic_target = (3, 1, 4, 1, 5), (7, 7, 2, 9)
    c.rollout.group_size = 8
    c.rollout.workers = 0           # sample inline: one process, no thread contention on a 2-core CPU
    c.stream.groups_per_step = 2
    c.stream.max_pulls_per_step = 4
    c.stream.overlong = "none"
    c.train.seq_len = 16
    c.train.steps = steps
    c.train.export_hf = False
    c.optim.lr = 1e-2
    c.checkpoint.every = 1000
    return c


def test_the_advantage_sign_decides_the_direction():
    """One step on trajectories of the target (A > 0) and of other tokens (A < 0) raises the
    target's log-prob; the same step with the advantages negated lowers it."""
    import optax
    from reterm_jax.rl.inference.sampling import token_logprobs
    graphdef, params, _ = _model_and_batch()
    mesh = make_mesh()
    prompt, target, other = [3, 1, 4, 1, 5], [7, 7, 2, 9], [[11, 12, 13, 14], [20, 21, 22, 23], [30, 31, 32, 33]]
    rows = [prompt + target] + [prompt + o for o in other]
    t = 16
    tokens = np.zeros((4, t), np.int32)
    tokens[:, :9] = rows
    seg = (np.arange(t) < 9).astype(np.int32)[None].repeat(4, 0)
    mask = np.zeros((4, t), np.float32)
    mask[:, 4:8] = 1  # targets[4..7] are the 4 sampled tokens
    targets = np.roll(tokens, -1, axis=1)
    model_logp = jax.jit(lambda p, x: token_logprobs(nnx.merge(graphdef, p)(x), jnp.roll(x, -1, axis=1),
                                                     SamplingParams(1.0)))

    def target_logp(p):
        return float(jnp.sum(model_logp(p, jnp.asarray(tokens))[0] * mask[0]))

    old = np.asarray(model_logp(params, jnp.asarray(tokens))) * mask
    adv = np.array([1.0, -1 / 3, -1 / 3, -1 / 3], np.float32)[:, None].repeat(t, 1)
    tx, schedule = optax.adam(3e-3), optax.constant_schedule(3e-3)
    shardings = train_state_shardings(tx, params, jax.tree.map(lambda _: replicated(mesh), params), mesh)
    step = make_grpo_step(graphdef, tx, schedule, micro_batches=1, mesh=mesh, shardings=shardings,
                          sampling_temperature=1.0, loss_cfg=_loss_cfg())
    before = target_logp(params)
    after = {}
    for sign in (1.0, -1.0):
        batch = {"tokens": tokens, "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (4, t)).copy(),
                 "segment_ids": seg, "targets": targets, "loss_mask": mask, "old_logprobs": old.astype(np.float32),
                 "advantages": sign * adv, "weights": np.ones((4, t), np.float32)}
        state = create_train_state(jax.tree.map(jnp.copy, params), tx, shardings, seed=0)
        state, _ = step(state, {k: jnp.asarray(v) for k, v in batch.items()}, None)
        after[sign] = target_logp(state.params)
    assert after[1.0] > before + 0.05 and after[-1.0] < before - 0.05, (before, after)


# ---- real sandboxes: a short run completes, checkpoints and resumes -------------------------------------
def _train_json(workdir, step):
    import glob
    import json
    return json.load(open(glob.glob(os.path.join(workdir, "checkpoints", str(step), "train", "*"))[0]))


@pytest.mark.docker
@pytest.mark.slow
def test_grpo_on_sandboxes_checkpoints_and_resumes(docker_client, task_path, tmp_path):
    import grpo as grpo_config
    from reterm_jax.rl.grpo.failure_bank import FailureBank
    from reterm_jax.rl.grpo import loop as grpo
    c = grpo_config.get_config("tiny")
    c.init.from_scratch = True      # a random tiny model: no SFT warm start needed
    _small_model(c)
    c.env.tasks = str(task_path("make_greeting"))
    c.rollout.group_size = 2
    c.rollout.max_turns, c.rollout.max_new_tokens_per_turn = 1, 16
    c.rollout.max_tokens, c.rollout.cache_length, c.train.seq_len = 1024, 1024, 1024
    c.rollout.collect_batch, c.bank.min_failures = 1, 1
    c.rollout.workers = 0           # inline: the bank cursor at a checkpoint is exactly the consumed groups
    c.stream.groups_per_step, c.stream.max_pulls_per_step = 1, 1
    c.stream.dynamic_sampling = False  # a random policy never solves: train on its (zero-advantage) rows anyway
    c.stream.overlong = "none"      # its 16-token turns end at the turn limit: keep them
    c.train.steps, c.checkpoint.every = 3, 1
    c.train.export_hf = False
    workdir = str(tmp_path / "run")
    try:
        first = grpo.train(c, workdir, stop_at_step=2)
        assert first["last_step"] == 2 and sorted(first["rewards"]) == [1, 2]
        saved = _train_json(workdir, 2)
        assert saved["policy_version"] == 2 and saved["bank"]["pos"] >= 1
        assert saved["data_iterator"]["batches"] == 2
        second = grpo.train(c, workdir)
        assert second["resumed"]["step"] == 2 and second["resumed"]["policy_version"] == 2
        assert second["resumed"]["bank"] == saved["bank"]          # the bank continues from its position
        assert sorted(second["rewards"]) == [3]
        final = _train_json(workdir, 3)
        assert final["policy_version"] == 3 and final["data_iterator"]["batches"] == 3
        assert final["data_iterator"]["trajectories"] >= 1          # real sandbox rows reached the step
        assert (final["bank"]["epoch"], final["bank"]["pos"]) != (saved["bank"]["epoch"], saved["bank"]["pos"])
        # the producer's counters reach TensorBoard (counted from the resumed process's start)
        tb = tb_scalars(os.path.join(workdir, "tb"))
        assert tb["train/producer_groups"] == {1: 1.0, 2: 2.0, 3: 1.0}      # one group a step; 0 again at the resume
        assert tb["train/producer_failures_added"][1] == 1.0               # the task's scripted fault, seeded
        assert tb["train/producer_sandbox_errors"][3] == 0 and "train/producer_guided" in tb
    finally:
        if os.path.isdir(os.path.join(workdir, "failure_bank")):
            FailureBank(os.path.join(workdir, "failure_bank")).destroy()


def test_presets_check_and_match_the_sft_model():
    import grpo as grpo_config
    import sft as sft_config
    from reterm_jax.rl.grpo.config import check_config
    for preset in ("tiny", "qwen3_5_9b"):
        c = grpo_config.get_config(preset)
        assert c.mode == "grpo"
        # the SFT warm start fits: the same model; only remat (how the backward recomputes) may differ,
        # the 9B GRPO rows (262k) need remat=block where SFT's 64k rows take full
        grpo_model, sft_model = c.model.to_dict(), sft_config.get_config(preset).model.to_dict()
        assert {k: v for k, v in grpo_model.items() if k != "remat"} == \
            {k: v for k, v in sft_model.items() if k != "remat"}
        assert grpo_model["remat"] == ("block" if preset == "qwen3_5_9b" else sft_model["remat"])
        c.env.tasks = c.env.tasks or os.path.join(os.path.dirname(os.path.dirname(__file__)), "tasks", "*")
        check_config(c, 1)
        assert c.rollout.max_tokens <= c.train.seq_len


def test_a_step_without_signal_changes_nothing(tmp_path, monkeypatch):
    """Step 1 has signal and updates (Adam's moments become non-zero); steps 2-3 see only groups
    whose members all score the same (no signal): they must leave the params, the optimizer state
    (moments and the schedule's count), the update counter and the policy version exactly as
    step 1 left them, and be counted as skipped. Zero-gradient Adam steps would still move the
    params through the moments; that is what this catches."""
    from reterm_jax.rl.grpo import workers as workers_mod
    from reterm_jax.rl.grpo import loop as grpo
    from reterm_jax.train.checkpointing import Checkpointer
    from reterm_jax.train.optimizer import make_optimizer
    from reterm_jax.train.state import abstract_params, abstract_train_state, train_state_shardings

    real = workers_mod.match_fraction
    calls = {"n": 0}

    def first_groups_only(target):  # the real reward for step 1's 2 groups of 8, then 0 for all
        fn = real(target)

        def reward(tokens):
            calls["n"] += 1
            return fn(tokens) if calls["n"] <= 2 * 8 else 0.0
        return reward

    monkeypatch.setattr(workers_mod, "match_fraction", first_groups_only)
    c = synthetic_config(3)
    c.stream.dynamic_sampling = True
    c.stream.groups_per_step = c.stream.max_pulls_per_step = 2   # step 1 pulls exactly 2 groups
    c.checkpoint.every, c.checkpoint.keep = 1, 5
    c.optim.weight_decay = 0.1    # decoupled decay would shrink the params on an empty step too
    workdir = str(tmp_path / "run")
    result = grpo.train(c, workdir)
    assert result["updated_steps"] == [1] and result["skipped_steps"] == [2, 3], result
    assert result["policy_version"] == 1 and sorted(result["losses"]) == [1]
    assert sorted(result["rewards"]) == [1, 2, 3]   # the rollouts' stats are still logged

    mesh = make_mesh()
    _, _, abs_p, p_sh = abstract_params(c.model, mesh)
    optim = c.optim.copy_and_resolve_references()
    optim.decay_steps = max(c.train.steps, optim.warmup_steps + 1)
    tx, _ = make_optimizer(optim)
    target = abstract_train_state(abs_p, tx, train_state_shardings(tx, abs_p, p_sh, mesh))
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=10, save_every=1)
    (s1, _, e1), (s3, _, e3) = (ckpt.restore(s, target, with_extra=True) for s in (1, 3))
    ckpt.close()
    assert e1["policy_version"] == e3["policy_version"] == 1
    for name in ("params", "opt_state"):
        a, b = jax.tree.leaves(getattr(s1, name)), jax.tree.leaves(getattr(s3, name))
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)
    moments = [x for x in jax.tree.leaves(s3.opt_state) if jnp.issubdtype(x.dtype, jnp.floating) and x.ndim]
    assert any(float(jnp.abs(m).max()) > 0 for m in moments)  # step 1 made them non-zero
    # resuming continues from the updates applied, not from the loop step
    c.train.steps = 4
    again = grpo.train(c, workdir)
    assert again["resumed"]["policy_version"] == 1


_SHARDED_GRPO = """
import json, sys
sys.path[:0] = [{tests!r}]
import jax
assert jax.device_count() == 4, jax.devices()
import numpy as np
import reterm_jax.rl.inference.sampler as sampler_mod
meshes = []
_init = sampler_mod.Sampler.__init__
def init(self, *a, **k):
    meshes.append(None if k.get("mesh") is None else dict(k["mesh"].shape))
    _init(self, *a, **k)
sampler_mod.Sampler.__init__ = init
from reterm_jax.rl.inference.policy_store import PolicyStore
specs = set()
_publish = PolicyStore.publish
def publish(self, version, params):
    _publish(self, version, params)
    specs.update(str(x.sharding.spec) for x in jax.tree.leaves(self.latest()[1]))
PolicyStore.publish = publish
from test_grpo_train import synthetic_config
from reterm_jax.rl.grpo import loop as grpo
c = synthetic_config(2)
c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 2, 2
c.rollout.weights_sharding = "tensor"  # the 9B preset's: published split over tensor only
r = grpo.train(c, {workdir!r})
print("RESULT" + json.dumps({{"meshes": meshes, "steps": r["last_step"], "specs": sorted(specs),
                             "losses": [float(v) for v in r["losses"].values()]}}))
"""


def test_grpo_on_four_devices_samples_on_the_trainers_mesh(tmp_path):
    """One process, 4 fake devices: the GRPO loop's sampler gets the trainer's mesh (its state is
    sharded, tests/test_rl_sampler_sharded.py), every published copy of the weights is split over
    tensor only (rollout.weights_sharding=tensor), and the run trains."""
    import json
    import subprocess
    script = _SHARDED_GRPO.format(tests=os.path.join(ROOT, "tests"), workdir=str(tmp_path / "run"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=with_test_flags("--xla_force_host_platform_device_count=4"))
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[len("RESULT"):])
    assert out["meshes"] == [{"data": 1, "fsdp": 2, "tensor": 2}] and out["steps"] == 2
    assert out["losses"] and all(np.isfinite(out["losses"]))
    assert out["specs"] and not any("fsdp" in s for s in out["specs"]), out["specs"]
    assert any("tensor" in s for s in out["specs"]), out["specs"]


# ---- GRPO learns, end to end: the sign and the loss mask -------------------------------------------------
def one_token_config(steps: int):
    """The reply is ONE sampled token and the reward is 1 when it is token 7 (a 16-token vocabulary:
    a random policy scores ~1/16). One token because a loss mask shifted by one must train nothing
    useful: with a longer reply it would still train the reply's later tokens, which also hold it."""
    c = synthetic_config(steps)
    c.env.synthetic_target = (7,)
    c.stream.max_pulls_per_step = 3
    return c


def _sabotage(monkeypatch, bug: str):
    """Put one bug into the real stream: the advantage's sign flipped, or the loss mask one token off."""
    from reterm_jax.rl.grpo import stream
    if bug == "sign":
        advantages = stream.group_advantages
        monkeypatch.setattr(stream, "group_advantages", lambda *a, **k: -np.asarray(advantages(*a, **k)))
    elif bug.startswith("mask"):
        shift, to_batch = int(bug[4:]), stream.groups_to_batch

        def shifted(*a, **k):
            batch = to_batch(*a, **k)
            batch["loss_mask"] = np.roll(batch["loss_mask"], shift, axis=1)
            return batch
        monkeypatch.setattr(stream, "groups_to_batch", shifted)


@pytest.mark.parametrize("bug", ["none", "sign", "mask+1", "mask-1"])
def test_grpo_learns_to_say_the_rewarded_token(tmp_path, monkeypatch, bug):
    """Through the real loop (producer -> stream -> loss -> jitted step -> published params), the mean
    reward climbs from ~1/16 to >= 0.9 within 16 steps; each bug keeps it from getting there."""
    from reterm_jax.rl.grpo import loop as grpo
    _sabotage(monkeypatch, bug)
    steps = 16
    result = grpo.train(one_token_config(steps), str(tmp_path / "run"))
    assert result["last_step"] == steps and result["resumed"] is None
    rewards = [float(result["rewards"][s]) for s in range(1, steps + 1)]
    assert np.mean(rewards[:2]) < 0.3, rewards
    learned = np.mean(rewards[-3:]) >= 0.9
    assert learned == (bug == "none"), (bug, rewards)
