"""The failure bank against the real Docker engine: branching, restarts, the reaper, pruning,
the next() order and broken directories."""
import json
import logging
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest

from reterm_jax.rl.grpo.failure_bank import FailureBank, FailureBankError, prune_victims
from reterm_jax.rl.agent.trajectory import Trajectory
from reterm_jax.sandbox import DockerSandbox, labels, load_task, reap, verify

REPO = Path(__file__).resolve().parents[1]
needs_docker = pytest.mark.docker


def _image_exists(client, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def _trajectory(text: str, tokens=(1, 2, 3)) -> Trajectory:
    return Trajectory(task_id="make_greeting", episode_id=text,
                      messages=[{"role": "user", "content": text}], tokens=list(tokens))


@pytest.fixture
def greeting(task_path):
    return load_task(task_path("make_greeting"))


@pytest.fixture
def bank_dirs(tmp_path, docker_client):
    """Bank directories; every bank made on them is destroyed at the end, images included."""
    opened: list[FailureBank] = []
    made: list[Path] = []

    def make(name="bank", **kw) -> FailureBank:
        d = tmp_path / name
        made.append(d)
        bank = FailureBank(d, **kw)
        opened.append(bank)
        return bank

    yield make
    for b in opened:
        if not b._closed:
            b.close()
    for d in made:
        if (d / "bank.json").exists():
            FailureBank(d).destroy()


@pytest.fixture
def failed_sandbox(docker_client, greeting):
    sb = DockerSandbox.from_task(greeting)
    yield sb
    sb.close()


def _add(bank, sb, task, i: int, **kw):
    sb.exec(f"echo {i} > /app/step_{i}")
    return bank.add(sb, task, _trajectory(f"attempt {i}", tokens=[10 + i, 11, 12]),
                    policy_version=i, reward=0.0, end_reason="stop", **kw)


@needs_docker
def test_add_then_branch_sees_the_failure_state_and_branches_are_independent(
        bank_dirs, failed_sandbox, greeting, docker_client):
    sb = failed_sandbox
    sb.exec("echo 'hello sandbox' > /app/greeting.txt && cd /app && export STAGE=failed")
    bank = bank_dirs(seed=1)
    traj = _trajectory("try", tokens=[5, 6, 7, 99, 8, 9])
    entry = bank.add(sb, greeting, traj, policy_version=4, reward=0.25, end_reason="max_turns",
                     end_token=99)
    sb.exec("echo later > /app/after_add.txt")  # after the commit: not in the failure state
    assert entry.tokens == [5, 6, 7, 99] and entry.messages == traj.messages
    assert (entry.policy_version, entry.reward, entry.end_reason) == (4, 0.25, "max_turns")
    assert entry.task_dir == str(greeting.path) and entry.task_name == "make_greeting"
    assert entry.size_bytes > 0
    assert bank.get(entry.entry_id) == entry and len(bank) == 1
    image_labels = docker_client.images.get(entry.image).labels
    assert image_labels[labels.KIND] == labels.KIND_BANK
    assert image_labels[labels.BANK] == bank.bank_id

    branches = bank.branch(entry, 3)
    try:
        assert bank.pinned() == {entry.entry_id}
        for i, b in enumerate(branches):
            assert b.task == greeting and b.limits.memory_mb == greeting.memory_mb
            assert b.exec("pwd; echo $STAGE; cat greeting.txt").output == "/app\nfailed\nhello sandbox\n"
            assert b.exec("test -e /app/after_add.txt; echo $?").output == "1\n"
            b.exec(f"echo mine > /app/branch_{i}")
        for i, b in enumerate(branches):
            assert b.exec("ls /app | grep -c '^branch_'").output == "1\n"
            assert b.exec(f"cat /app/branch_{i}").output == "mine\n"
        result = verify(branches[0])  # a recovery attempt is verified on its own clone
        assert result.error is None and result.reward == 0.0  # "hello sandbox" lacks the comma
    finally:
        for b in branches:
            b.close()
    assert bank.pinned() == set()

    # One writer per directory; a closed bank reopens with the same entries.
    with pytest.raises(FailureBankError, match="close"):
        FailureBank(bank.directory)
    bank.close()
    again = bank_dirs()
    assert again.entry_ids() == [entry.entry_id] and again.get(entry.entry_id) == entry
    again.destroy()
    assert not _image_exists(docker_client, entry.image)
    assert not bank.directory.exists()


@needs_docker
def test_the_verifiers_snapshot_is_the_banked_image(bank_dirs, failed_sandbox, greeting, docker_client,
                                                    monkeypatch):
    """bank.snapshot + verify(snapshot=) + add(snapshot=): the failure state is committed once,
    verified on a clone of that image, and the entry keeps the very image; a passing state's
    snapshot is deleted on release; a snapshot the bank did not make is refused."""
    import reterm_jax.rl.grpo.failure_bank as fb
    import reterm_jax.sandbox.snapshots as snapshots
    commits = []

    def counting_commit(*a, **kw):  # the real commit, counted
        commits.append(kw.get("what", "snapshot"))
        return snapshots.commit_image(*a, **kw)
    monkeypatch.setattr(fb, "commit_image", counting_commit)
    monkeypatch.setattr(snapshots, "take_snapshot", lambda sb: snapshots.Snapshot(counting_commit(
        sb, labels.labels(labels.KIND_SNAPSHOT)), sb))
    bank = bank_dirs()
    sb = failed_sandbox
    sb.exec("echo 'hello sandbox' > /app/greeting.txt")
    snap = bank.snapshot(sb, greeting)
    result = verify(sb, greeting, snapshot=snap)
    assert result.error is None and result.reward == 0.0 and _image_exists(docker_client, snap.image_id)
    entry = bank.add(sb, greeting, _trajectory("failed"), policy_version=1, reward=result.reward,
                     end_reason="stop", snapshot=snap)
    snap.release()  # a no-op now: the bank owns the image
    assert commits == ["commit"] and docker_client.images.get(entry.image).id == snap.image_id
    assert docker_client.images.get(entry.image).labels[labels.KIND] == labels.KIND_BANK
    (b,) = bank.branch(entry, 1)
    with b:
        assert b.exec("cat /app/greeting.txt").output == "hello sandbox\n"
        assert b.exec("test -e /logs/verifier/reward.txt; echo $?").output == "1\n"  # not the clone's

    sb.exec("echo 'hello, sandbox' > /app/greeting.txt")  # now it passes: not banked
    passing = bank.snapshot(sb, greeting)
    assert verify(sb, greeting, snapshot=passing).reward == 1.0
    passing.release()
    assert not _image_exists(docker_client, passing.image_id) and len(bank) == 1
    with sb.snapshot() as foreign, pytest.raises(ValueError, match="this bank's snapshot"):
        bank.add(sb, greeting, _trajectory("x"), policy_version=1, reward=0.0, end_reason="stop",
                 snapshot=foreign)
    assert len(bank) == 1 and bank.entry_ids() == [entry.entry_id]


_CRASHING_RUN = textwrap.dedent("""
    import os, sys
    from reterm_jax.rl.grpo.failure_bank import FailureBank
    from reterm_jax.rl.agent.trajectory import Trajectory
    from reterm_jax.sandbox import DockerSandbox, load_task
    task = load_task(sys.argv[2])
    sb = DockerSandbox.from_task(task)
    sb.exec("echo from-the-crashed-run > /app/crash.txt")
    bank = FailureBank(sys.argv[1])
    e = bank.add(sb, task, Trajectory("t", "e", [{"role": "user", "content": "x"}], tokens=[1, 2]),
                 policy_version=7, reward=0.0, end_reason="stop")
    print(e.entry_id, e.image, flush=True)
    os._exit(0)  # a crash: no atexit, the sandbox's container is left behind
""")


@needs_docker
def test_the_bank_survives_a_crash_and_the_reaper(bank_dirs, tmp_path, task_path, docker_client):
    out = subprocess.run([sys.executable, "-c", _CRASHING_RUN, str(tmp_path / "bank"),
                          str(task_path("make_greeting"))], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    entry_id, image = out.stdout.split()
    reap()  # removes the dead run's container; must keep the bank's image
    assert _image_exists(docker_client, image)
    bank = bank_dirs()
    assert len(bank) == 1
    entry = bank.next()
    assert (entry.entry_id, entry.image, entry.policy_version, entry.tokens) == (entry_id, image, 7, [1, 2])
    (b,) = bank.branch(entry, 1)
    with b:
        assert b.exec("cat /app/crash.txt").output == "from-the-crashed-run\n"


@needs_docker
def test_pruning_by_count_age_and_size_is_oldest_first_and_spares_pinned_entries(
        bank_dirs, failed_sandbox, greeting, docker_client):
    bank = bank_dirs(max_entries=2)
    e1, e2 = _add(bank, failed_sandbox, greeting, 1), _add(bank, failed_sandbox, greeting, 2)
    (held,) = bank.branch(e1, 1)
    with held:
        e3 = _add(bank, failed_sandbox, greeting, 3)  # 3 > max_entries; e1 is pinned -> e2 goes
        assert bank.entry_ids() == [e1.entry_id, e3.entry_id]
        assert _image_exists(docker_client, e1.image) and not _image_exists(docker_client, e2.image)
        assert held.exec("cat /app/step_1").output == "1\n"
    assert bank.prune() == []
    e4 = _add(bank, failed_sandbox, greeting, 4)  # nothing pinned now: the oldest (e1) goes
    assert bank.entry_ids() == [e3.entry_id, e4.entry_id]
    assert not _image_exists(docker_client, e1.image)

    bank.max_age_s = 1000.0
    between = (e3.created + e4.created) / 2 + 1000.0  # e3 is older than max_age_s then, e4 not
    assert bank.prune(now=between) == [e3.entry_id]
    assert not _image_exists(docker_client, e3.image) and _image_exists(docker_client, e4.image)

    e5 = _add(bank, failed_sandbox, greeting, 5)
    assert e4.size_bytes > 0 and e5.size_bytes > 0
    bank.max_bytes = e5.size_bytes  # room for the newest only
    assert bank.prune() == [e4.entry_id]
    assert bank.entry_ids() == [e5.entry_id]
    assert not _image_exists(docker_client, e4.image) and _image_exists(docker_client, e5.image)


@needs_docker
def test_next_order_is_deterministic_and_resumes_from_its_state(
        bank_dirs, failed_sandbox, greeting):
    bank = bank_dirs(seed=3)
    ids = [_add(bank, failed_sandbox, greeting, i).entry_id for i in range(3)]
    seq = [bank.next().entry_id for _ in range(4)]
    mid = bank.state()
    seq += [bank.next().entry_id for _ in range(3)]
    assert sorted(seq[:3]) == sorted(ids) and sorted(seq[3:6]) == sorted(ids)  # epochs
    json.dumps(mid)  # checkpointable
    bank.set_state(mid)
    assert [bank.next().entry_id for _ in range(3)] == seq[4:]
    bank.set_state({"seed": 3, "epoch": 0, "pos": 0, "order": []})
    assert [bank.next().entry_id for _ in range(7)] == seq

    # A reopened bank continues from the persisted cursor; a new entry joins the next epoch.
    bank.set_state(mid)
    bank.close()
    bank = bank_dirs(seed=3)
    assert bank.next().entry_id == seq[4]
    new = _add(bank, failed_sandbox, greeting, 9).entry_id
    rest = [bank.next().entry_id for _ in range(1 + 4)]
    assert rest[0] == seq[5] and sorted(rest[1:]) == sorted(ids + [new])


@needs_docker
def test_an_image_removed_behind_the_banks_back_drops_its_entry(
        bank_dirs, failed_sandbox, greeting, docker_client, caplog):
    bank = bank_dirs()
    gone, kept = _add(bank, failed_sandbox, greeting, 1), _add(bank, failed_sandbox, greeting, 2)
    bank.close()
    docker_client.images.remove(gone.image)
    with caplog.at_level(logging.WARNING, logger="reterm_jax.rl.grpo.failure_bank"):
        bank = bank_dirs()
    assert bank.entry_ids() == [kept.entry_id]
    assert gone.entry_id in caplog.text and "gone" in caplog.text
    assert not (bank.directory / "entries" / f"{gone.entry_id}.json").exists()
    assert json.loads((bank.directory / "bank.json").read_text())["entries"][0]["entry_id"] \
        == kept.entry_id

    # An index lost by hand leaves images no entry names: a new bank on the path removes them.
    bank.close()
    (bank.directory / "bank.json").unlink()
    bank = bank_dirs()
    assert len(bank) == 0 and not _image_exists(docker_client, kept.image)


@needs_docker
def test_threads_add_next_and_branch_concurrently(bank_dirs, greeting, docker_client):
    bank = bank_dirs(max_entries=3)
    sandboxes = [DockerSandbox.from_task(greeting) for _ in range(2)]

    def work(k: int):
        sb = sandboxes[k % 2]
        entry = bank.add(sb, greeting, _trajectory(f"w{k}"), policy_version=k, reward=0.0,
                         end_reason="stop")
        picked = bank.next()
        try:
            branches = bank.branch(picked, 1)
        except Exception as e:  # noqa: BLE001 - pruned between next() and branch(): allowed
            assert "no longer in the bank" in str(e)
            return entry.entry_id
        for b in branches:
            assert b.exec("test -d /app && echo ok").output == "ok\n"
            b.close()
        return entry.entry_id

    try:
        with ThreadPoolExecutor(4) as ex:
            added = list(ex.map(work, range(6)))
    finally:
        for sb in sandboxes:
            sb.close()
    assert len(set(added)) == 6 and len(bank) == 3 and bank.pinned() == set()
    assert bank.prune() == []
    index = json.loads((bank.directory / "bank.json").read_text())
    assert sorted(e["entry_id"] for e in index["entries"]) == sorted(bank.entry_ids())  # threads add in any order
    sel = labels.managed_filter(labels.KIND_BANK, **{labels.BANK: bank.bank_id})
    images = {im.id for im in docker_client.images.list(all=True, filters=sel)}
    assert images == {e["image_id"] for e in index["entries"]}


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": "something else"}),
                                     json.dumps({"format": "reterm_jax.failure_bank",
                                                 "version": 1, "bank_id": "x"})])
def test_a_corrupt_index_is_a_clear_error(tmp_path, content):
    (tmp_path / "bank.json").write_text(content)
    with pytest.raises(FailureBankError) as err:
        FailureBank(tmp_path)
    assert str(tmp_path / "bank.json") in str(err.value) and "remove the directory" in str(err.value)
    with pytest.raises(FailureBankError, match="not a valid failure bank index"):
        FailureBank(tmp_path)  # the failed open released the directory's lock


def test_prune_policy_is_oldest_first_and_skips_held_entries():
    entries = [{"entry_id": f"e{i}", "created": 100.0 + i, "size_bytes": 10} for i in range(5)]
    policy = dict(now=200.0, max_age_s=1000.0, max_entries=10, max_bytes=10**9)
    assert prune_victims(entries, held=set(), **policy) == []
    assert prune_victims(entries, held=set(), **{**policy, "max_entries": 3}) == ["e0", "e1"]
    assert prune_victims(entries, held={"e0"}, **{**policy, "max_entries": 3}) == ["e1", "e2"]
    assert prune_victims(entries, held={"e1"}, **{**policy, "max_bytes": 25}) == ["e0", "e2", "e3"]
    assert prune_victims(entries, held={"e0"}, **{**policy, "now": 1102.5}) == ["e1", "e2"]
    # Everything held: limits cannot be met, nothing is chosen.
    assert prune_victims(entries, held={f"e{i}" for i in range(5)},
                         **{**policy, "max_entries": 0, "now": 10**6}) == []


@needs_docker
def test_entries_that_split_come_first_solved_ones_retire_and_old_ones_age_out(
        bank_dirs, failed_sandbox, greeting, docker_client):
    """record(): an entry whose groups split (0 < pass rate < 1) leads the next epoch, untried
    ones follow, always-failing ones come last; an entry whose last retire_after groups all passed
    is removed (image too); retire_older_than drops entries of older policies. The outcomes
    survive a reopen."""
    bank = bank_dirs(seed=1)
    ids = [_add(bank, failed_sandbox, greeting, i).entry_id for i in range(4)]  # policy versions 0..3
    for _ in range(4):  # finish the first epoch (no outcomes yet)
        bank.next()
    split, fails, solved, untried = ids[2], ids[0], ids[1], ids[3]
    assert not bank.record(split, [True, False, False])
    assert not bank.record(fails, [False, False, False])
    assert not bank.record(solved, [True, True]) and not bank.record(solved, [True, True, True])
    assert bank.outcomes(split) == {"groups": 1, "attempts": 3, "passes": 1, "all_pass_streak": 0}
    assert bank.outcomes(solved)["all_pass_streak"] == 2
    bank.close()
    bank = bank_dirs(seed=1)  # reopened: the outcomes are in the index
    assert bank.outcomes(split)["passes"] == 1
    order = [bank.next().entry_id for _ in range(4)]
    assert order[0] == split and order[1] == untried and set(order[2:]) == {fails, solved}
    image = bank.get(solved).image
    assert bank.record(solved, [True], retire_after=3) and solved not in bank.entry_ids()
    assert not _image_exists(docker_client, image) and bank.retired == 1
    assert bank.retire_older_than(2) == [fails] and sorted(bank.entry_ids()) == sorted([split, untried])
