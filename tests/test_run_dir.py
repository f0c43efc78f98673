"""The run directory (training/checkpoint.py): one owner each, siblings on collision, resume refused while in use."""

import multiprocessing as mp

import pytest

from training.checkpoint import CLAIM, RunDirBusy, claim_existing, claim_new, discard_if_unused


def _claim_in_child(path, queue):
    claim = claim_new(path)
    queue.put(str(claim.run_dir))


def claim_and_hold(path, claimed, done):
    """In a child process: claim `path` as a new run does (it must get it), say so, hold it until done."""
    claim = claim_new(path)
    assert claim.run_dir == path
    claimed.set()
    done.wait(60)
    claim.release()


def test_two_claims_of_one_directory_get_distinct_directories(tmp_path):
    target = tmp_path / "2026-11-30" / "10-00-00_run"
    first = claim_new(target)
    second = claim_new(target)  # e.g. a second run started in the same second
    third = claim_new(target)
    assert [c.run_dir for c in (first, second, third)] == [
        target,
        target.with_name(target.name + "-1"),
        target.with_name(target.name + "-2"),
    ]


def test_concurrent_processes_never_claim_the_same_directory(tmp_path):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_claim_in_child, args=(tmp_path / "same", queue)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    claimed = [queue.get(timeout=5) for _ in procs]
    assert len(set(claimed)) == 6


def test_a_directory_holding_an_older_run_is_never_reused(tmp_path):
    old = tmp_path / "run"
    (old / "checkpoints").mkdir(parents=True)  # a run from before claim files existed
    assert claim_new(old).run_dir == tmp_path / "run-1"


def test_resume_is_refused_while_a_live_process_holds_the_directory(tmp_path):
    claim = claim_new(tmp_path / "run")
    with pytest.raises(RunDirBusy, match=r"in use by a live run \(pid \d+"):
        claim_existing(tmp_path / "run")
    claim.release()  # the run ended (a crash releases it too: the kernel drops the lock)
    again = claim_existing(tmp_path / "run")
    assert again.run_dir == tmp_path / "run"
    again.release()


def test_discard_removes_only_directories_that_hold_nothing_of_a_run(tmp_path):
    empty, used = tmp_path / "empty", tmp_path / "used"
    for d in (empty, used):
        claim_new(d).release()
        (d / "train.log").write_text("")
    (used / "config.yaml").write_text("seed: 0\n")
    discard_if_unused(empty)
    discard_if_unused(used)
    assert not empty.exists()
    assert (used / CLAIM).exists() and (used / "config.yaml").exists()


def test_discard_keeps_a_directory_another_run_has_claimed(tmp_path):
    """Another live run owns the directory but has written nothing else yet (it started in the same second
    and is still preparing): a run that lost the claim, or failed to start, must not remove it. Nor a
    directory whose claim file was just created and is still empty."""
    ctx = mp.get_context("fork")
    claimed, done = ctx.Event(), ctx.Event()
    owner = ctx.Process(target=claim_and_hold, args=(tmp_path / "r", claimed, done))
    owner.start()
    try:
        assert claimed.wait(30)
        (tmp_path / "r" / "train.log").write_text("")  # Hydra's log, empty so far
        discard_if_unused(tmp_path / "r")
        assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [CLAIM, "train.log"]
    finally:
        done.set()
        owner.join(30)
    being_written = tmp_path / "new"
    being_written.mkdir()
    (being_written / CLAIM).write_text("")
    discard_if_unused(being_written)
    assert (being_written / CLAIM).exists()


def test_discard_of_a_directory_another_rank_removed_first_is_quiet(tmp_path, monkeypatch):
    """Two ranks of a resume started the same second share Hydra's unused directory: the one that lists it after the
    other removed it must not fail (a FileNotFoundError once ended a 2-rank resume in the suite)."""
    gone = tmp_path / "outputs" / "2026-12-06" / "14-46-06_debug"
    monkeypatch.setattr(type(gone), "is_dir", lambda self: True)  # it was there when checked
    discard_if_unused(gone)
    assert not gone.exists()
