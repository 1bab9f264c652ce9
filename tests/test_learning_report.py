"""The learning run's bookkeeping (experiments/learning/learning_report.py): which SFT candidate the
validation slice picks, the limits derived from the demonstration rows, result.json's shape and
paired gains, and learning.png."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments", "learning"))
import learning_report as lr  # noqa: E402  (experiments/learning/, not the package)


def test_pick_warm_start_best_then_earliest():
    assert lr.pick_warm_start({400: 0.1, 800: 0.3, 1200: 0.3}) == 800
    assert lr.pick_warm_start({1200: 0.0, 400: 0.0}) == 400
    # a validation tie goes to the candidate that fits its own training better, then the earliest
    assert lr.pick_warm_start({400: 0.0, 800: 0.0}, {400: 0.1, 800: 0.5}) == 800
    assert lr.pick_warm_start({400: 0.2, 800: 0.0}, {400: 0.1, 800: 0.5}) == 400
    assert lr.pick_warm_start({400: 0.0, 800: 0.0}, {400: 0.0, 800: 0.0}) == 400
    with pytest.raises(ValueError):
        lr.pick_warm_start({})


def test_pick_warm_start_for_signal_prefers_a_score_near_one_half():
    scores = {2000: 0.0, 3000: 0.0, 4500: 0.4375, 6000: 0.875}  # run 6's validation scores
    assert lr.pick_warm_start(scores) == 6000
    assert lr.pick_warm_start(scores, rule="signal") == 4500
    assert lr.pick_warm_start({400: 0.25, 800: 0.75}, {400: 0.1, 800: 0.2}, rule="signal") == 800  # tie: fit
    assert lr.pick_warm_start({400: 0.0, 800: 0.0}, rule="signal") == 400  # nothing recovers: as "best"
    assert lr.pick_warm_start({400: 0.0, 800: 1.0}, rule="signal") == 800  # only candidate that recovers
    with pytest.raises(ValueError, match="rule"):
        lr.pick_warm_start({400: 0.5}, rule="median")


def test_sft_restart_spec_and_candidates():
    assert lr.parse_restart("") == ((), 0.0)
    assert lr.parse_restart("3000,1500@1e-3") == ((1500, 3000), 1e-3)
    for bad in ("1500,3000", "1500@", "@1e-3", "0,1500@1e-3", "a@1e-3", "1500@-1", "1500@0"):
        with pytest.raises(ValueError, match="--sft_restart"):
            lr.parse_restart(bad)
    # the second phase's steps count on from the first phase's last candidate
    assert lr.candidate_steps([3000, 2000], (1500, 3000)) == {
        2000: ("sft", 2000), 3000: ("sft", 3000), 4500: ("sft_restart", 1500), 6000: ("sft_restart", 3000)}
    assert lr.candidate_steps([400], ()) == {400: ("sft", 400)}
    # further phases count on from the previous phase's last step, each in its own run dir
    assert lr.candidate_steps([800], (400, 800), (400, 800)) == {
        800: ("sft", 800), 1200: ("sft_restart", 400), 1600: ("sft_restart", 800),
        2000: ("sft_restart2", 400), 2400: ("sft_restart2", 800)}


def test_limits_cover_the_longest_row_and_recovery():
    row = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
                        {"role": "assistant", "content": "", "tool_calls": [{"name": "bash"}]},
                        {"role": "tool", "content": "out"}, {"role": "user", "content": "retry"},
                        {"role": "assistant", "content": "", "tool_calls": [{"name": "bash"}, {"name": "bash"}]},
                        {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"},
                        {"role": "assistant", "content": "done"}]}
    assert lr.recovery_calls(row) == 2
    lim = lr.run_limits(2049, 5)
    assert lim["sft_seq_len"] == 2304 and lim["max_tokens"] == 2816 == lim["grpo_seq_len"]
    assert lim["cache_length"] > lim["max_tokens"] and lim["max_turns"] == 8
    assert "max_new_tokens_per_turn" not in lim  # no turn length given: the config's stays
    # the longest demonstrated turn (259 tokens: a generated task's heredoc) fits a turn with room to spare
    assert lr.longest_run([False, True, True, False, True, True, True, False]) == 3
    assert lr.longest_run([]) == 0 and lr.longest_run([True] * 259) == 259
    assert lr.run_limits(2049, 5, 259)["max_new_tokens_per_turn"] == 512


def _summary(rates):
    return {"recovery@2": {"score": sum(rates.values()) / len(rates), "per_task": rates}}


def test_result_json_pairs_the_policies_over_tasks(tmp_path):
    evals = {"warm_start": _summary({"a": 0.0, "b": 0.5}), "grpo": _summary({"a": 0.5, "b": 1.0}),
             "control": _summary({"a": 0.0, "b": 0.5})}
    res = lr.result(evals, tasks=2, samples=2, train_reward=[0.1, 0.4], wall_s=12.0)
    held = res["heldout"]
    assert held["grpo"]["recovery@2"] == 0.75 and held["warm_start"]["recovery@2"] == 0.25
    assert held["recovery@2_gain"] == {"mean": 0.5, "ci95": [0.5, 0.5]}
    assert held["gains"]["grpo-control"]["recovery@2"]["mean"] == 0.5
    assert held["gains"]["control-warm_start"]["recovery@2"]["mean"] == 0.0
    assert res["train_reward"] == [0.1, 0.4] and res["wall_s"] == 12.0
    with pytest.raises(ValueError, match="control"):
        lr.result({"warm_start": evals["warm_start"], "grpo": evals["grpo"]}, tasks=2, samples=2,
                  train_reward=[], wall_s=0)
    lo, hi = lr.interval({"a": 0.0, "b": 1.0})
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    pytest.importorskip("matplotlib")
    lr.plot(res, evals, str(tmp_path / "learning.png"))
    assert (tmp_path / "learning.png").read_bytes()[:4] == b"\x89PNG"


def test_fault_recovery_counts_the_models_attempt_only():
    from reterm_jax.rl.evaluation.protocols import AttemptRecord, Trial, fault_recovery_summary

    def rec(i, ok):
        return AttemptRecord(attempt=i, reward=float(ok), resolved=ok, tokens=0, context_tokens=0, turns=1,
                             time_s=0.0, verify_s=0.0, end_reason="completed")
    trials = [Trial("a", "fault-recovery", 0, [rec(1, False), rec(2, True)]),
              Trial("a", "fault-recovery", 1, [rec(1, False), rec(2, False)]),
              Trial("b", "fault-recovery", 0, [rec(1, True)]),  # the fault itself "passed": not the model's
              Trial("c", "fault-recovery", 0, error="image build failed")]
    s = fault_recovery_summary(trials)
    assert s["per_task"] == {"a": 0.5, "b": 0.0, "c": 0.0} and s["score"] == 0.5 / 3
    assert (s["tasks"], s["trials"], s["errored_trials"]) == (3, 4, 1)


def test_demonstrated_fault_kinds_rotate_over_instances():
    from reterm_jax.tasks.demos import chosen_faults
    faults = {"a": ["x"], "b": ["y"], "c": ["z"]}
    assert chosen_faults(faults, 7) == faults and chosen_faults(faults, 7, 5) == faults
    assert [list(chosen_faults(faults, i, 1)) for i in range(4)] == [["a"], ["b"], ["c"], ["a"]]
    assert list(chosen_faults(faults, 2, 2)) == ["c", "a"]
