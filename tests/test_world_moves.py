"""When the world moves under a run (issue 68), as a user moving files around a project would: a checkpoint copied or
moved anywhere resumes; a corpus edited since is refused (or, asked for, goes on and is recorded), one moved elsewhere
resumes from its intact token cache or from its new place; a data cache deleted mid-run costs no checkpoint; and no
file is hashed between saves, however often the run logs."""

import json
import os
import shutil
import stat

import pytest
import torch
from safetensors.torch import load_file

import training.checkpoint
from data.sources import load_plays
from tests.train_helpers import read_metrics, run_dirs, run_faulty, run_train, train_in_process

pytestmark = pytest.mark.serial  # trains

LENGTH = ["trainer.max_steps=12", "trainer.ckpt_interval=6", "trainer.eval_interval=6"]


def weights(ckpt):
    return load_file(ckpt / "model.safetensors")


def same_weights(a, b) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, tiny_data_cache):
    """A debug run stopped at step 6 of 12, and the same run uninterrupted: what a resume must reach."""
    root = tmp_path_factory.mktemp("stopped")
    run_train(root / "a", *LENGTH, "trainer.stop_at_step=6", cache_dir=tiny_data_cache)
    run_train(root / "b", *LENGTH, cache_dir=tiny_data_cache)
    (run,), (whole,) = run_dirs(root / "a"), run_dirs(root / "b")
    return run, whole / "checkpoints" / "step_0000012"


def test_a_checkpoint_copied_out_of_its_run_resumes_into_a_new_run_directory(stopped, tmp_path, tiny_data_cache):
    """`cp -r <run>/checkpoints/step_N elsewhere/mine` then `resume=elsewhere/mine` (before: a StopIteration traceback
    after the data was prepared): the run goes on in a run directory of its own, bitwise, and says where."""
    run, uninterrupted = stopped
    mine = shutil.copytree(run / "checkpoints" / "step_0000006", tmp_path / "elsewhere" / "mine")
    proc = run_train(tmp_path, f"resume={mine}", cache_dir=tiny_data_cache)
    (new,) = run_dirs(tmp_path)
    assert f"resume: {mine} is not inside a run directory; the run goes on in a new one, {new}" in proc.stderr
    assert same_weights(new / "checkpoints" / "step_0000012", uninterrupted)
    assert sorted(p.name for p in mine.iterdir()) == sorted(
        p.name for p in (run / "checkpoints" / "step_0000006").iterdir()
    )
    init = run_train(tmp_path / "init", f"init_from={mine}", "trainer.max_steps=2", cache_dir=tiny_data_cache)
    assert f"weights: from {mine}; a new run from step 0" in init.stdout  # init_from takes the copy too


def test_a_run_directory_that_cannot_be_written_resumes_beside_it(stopped, tmp_path, tiny_data_cache):
    """A run copied from a read-only place (a colleague's folder, a mounted archive): the resume cannot write there, so
    it goes on in a new run directory and says why, never losing the resume."""
    run, uninterrupted = stopped
    copy = shutil.copytree(run, tmp_path / "archive" / "run", ignore=shutil.ignore_patterns(".owner"))
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:  # root writes anywhere: run without the capabilities that let it (tests/fault_injection.py)
        proc = run_faulty(tmp_path, {"unprivileged": True}, f"resume={copy}", cache_dir=tiny_data_cache)
    finally:
        for path in [copy, *copy.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    (new,) = [r for r in run_dirs(tmp_path) if "archive" not in str(r)]
    assert (
        f"resume: cannot write into {copy} (permission denied); the run goes on in a new directory, {new}"
        in proc.stderr
    )
    assert same_weights(new / "checkpoints" / "step_0000012", uninterrupted)


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, play in enumerate(load_plays()[:2]):
        (folder / f"{i}.txt").write_text(play["text"])
    return folder


def local_run(tmp_path, corpus, *extra, **kwargs):
    args = ["data=local", f"data.path={corpus}/*.txt", "data.vocab_size=300", *LENGTH]
    return run_train(tmp_path, *args, *extra, cache_dir=tmp_path / "cache", **kwargs)


def test_a_resume_on_an_edited_corpus_is_refused_or_goes_on_recorded(tmp_path, corpus):
    """One word changed in one training file (before: the cache was rebuilt and the run went on silently, no longer
    the run it was): refused in one line naming both token caches and the two ways on; with resume_changed_data=true
    it goes on and state.json records the change."""
    local_run(tmp_path, corpus, "trainer.stop_at_step=6")
    (run,) = run_dirs(tmp_path)
    text = (corpus / "0.txt").read_text()
    (corpus / "0.txt").write_text(text.replace(" the ", " thy ", 1))
    refused = run_train(tmp_path, f"resume={run}", cache_dir=tmp_path / "cache", check=False)
    ckpt = run / "checkpoints" / "step_0000006"
    line = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 1 and line.startswith(f"error: the data changed since {ckpt}: its run trained on ")
    assert f"init_from={ckpt} (resume_changed_data=true goes on with this data, recorded in state.json)" in line
    assert not (run / "checkpoints" / "step_0000012").exists()
    run_train(tmp_path, f"resume={run}", "resume_changed_data=true", cache_dir=tmp_path / "cache")
    state = json.loads((run / "checkpoints" / "step_0000012" / "state.json").read_text())
    (change,) = state["data_changes"]
    before, after = change["before"], change["after"]
    assert change["at_step"] == 6 and (before["train_sha256"], before["val_sha256"]) != (
        after["train_sha256"],
        after["val_sha256"],
    )
    assert state["data"] == change["after"]  # what it trains on now


def test_a_moved_corpus_resumes_from_its_token_cache_or_its_new_place(tmp_path, corpus):
    """The corpus folder renamed (before: every resume failed in `matches no files`, and data.path=<new place> was
    refused as "other data"): the resume goes on from the intact token cache it trained on, and data.path pointing at
    the new place is the same data (the same digests), not "other data"."""
    local_run(tmp_path, corpus, "trainer.stop_at_step=6")
    (run,) = run_dirs(tmp_path)
    moved = corpus.rename(tmp_path / "moved")
    proc = run_train(tmp_path, f"resume={run}", "trainer.stop_at_step=9", cache_dir=tmp_path / "cache")
    assert "matches no files" in proc.stderr and "resuming from the token cache the run trained on" in proc.stderr
    for cache in (tmp_path / "cache").iterdir():  # the cache gone too: the new place alone
        shutil.rmtree(cache)
    run_train(tmp_path, f"resume={run}", f"data.path={moved}/*.txt", cache_dir=tmp_path / "cache")
    assert (run / "checkpoints" / "step_0000012" / "state.json").is_file()
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"][-1] == 12


def test_a_data_cache_deleted_mid_run_costs_no_checkpoint(tmp_path, tiny_data_cache, monkeypatch):
    """The cache folder removed after step 3 (a cleanup script, a full-disk purge; before: `cannot save step 6: the
    tokenizer … is missing` and no checkpoint): the run trains on the tokens it mapped, saves with the tokenizer it
    read at the start, and says once, naming the folder, that its cache disappeared."""
    import training.loop as loop

    cache = shutil.copytree(tiny_data_cache, tmp_path / "cache")
    real, said = loop.TrainStep.__call__, []

    def deleting(self, n):
        if n == 3:
            shutil.rmtree(cache)
        return real(self, n)

    monkeypatch.setattr(loop.TrainStep, "__call__", deleting)
    monkeypatch.setattr(loop, "say_for", lambda info: said.append)
    outcome = train_in_process(tmp_path / "run", *LENGTH, cache_dir=cache)
    assert not cache.exists() and outcome.state.step == 12
    ckpt = tmp_path / "run" / "checkpoints" / "step_0000012"
    assert (ckpt / "tokenizer.json").read_bytes() == (
        tmp_path / "run" / "checkpoints" / "step_0000006" / "tokenizer.json"
    ).read_bytes()
    gone = [line for line in said if "disappeared" in str(line)]
    assert len(gone) == 1 and str(cache) in gone[0] and "checkpoints carry the tokenizer read then" in gone[0]
    training.checkpoint.verify(ckpt)


def test_no_file_is_hashed_between_saves_however_often_the_run_logs(tmp_path, tiny_data_cache, monkeypatch):
    """Before: the loop hashed the newest checkpoint at every log, evaluation and save step to name it in a message
    almost never printed (~1 s per ~2 s of steps on the GPU preset). Now a run's SHA-256 work is its saves' bytes,
    hashed as they are written, whatever its log interval."""
    hashed = []
    real = training.checkpoint.file_sha256
    monkeypatch.setattr(training.checkpoint, "file_sha256", lambda path: hashed.append(path) or real(path))
    for interval in (1, 6):
        train_in_process(
            tmp_path / f"log{interval}", *LENGTH, f"trainer.log_interval={interval}", cache_dir=tiny_data_cache
        )
    assert hashed == []


def test_a_checkpoint_belongs_to_a_run_only_inside_one(tmp_path):
    """run_dir_of: <run>/checkpoints/step_N and <run>/checkpoints/best/step_N are the run's; a copy elsewhere, even
    into a folder named checkpoints, belongs to none (a resume then starts a new run directory, never writes there)."""
    run = tmp_path / "run"
    (run / "config.yaml").parent.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    inside = [run / "checkpoints" / "step_0000010", run / "checkpoints" / "best" / "step_0000010"]
    outside = [tmp_path / "elsewhere" / "mine", tmp_path / "backup" / "checkpoints" / "step_0000010"]
    for folder in inside + outside:
        folder.mkdir(parents=True)
    assert [training.checkpoint.run_dir_of(c) for c in inside] == [run.resolve()] * 2
    assert [training.checkpoint.run_dir_of(c) for c in outside] == [None, None]


def test_a_resume_claims_its_own_run_or_a_new_one_beside_it(tmp_path):
    """claim_for_run in one process: a fresh run claims Hydra's directory; a resume claims its run's; a checkpoint
    outside any run, or in a run this user cannot write, goes on in Hydra's new directory and says so."""
    from types import SimpleNamespace

    from training.distributed import DistInfo

    said, hydra, run = [], tmp_path / "hydra", tmp_path / "run"
    hydra.mkdir()
    run.mkdir()
    claim = lambda resume: training.checkpoint.claim_for_run(hydra, resume, DistInfo(), said.append)
    fresh, claimed = claim(None)
    assert fresh == hydra and claimed.run_dir == hydra and (hydra / ".owner").is_file() and not said
    claimed.release()
    (hydra / ".owner").unlink()
    own, claimed = claim(SimpleNamespace(path=run / "checkpoints" / "step_1", run_dir=run))
    assert own == run and (run / ".owner").is_file() and not said and not hydra.exists()  # Hydra's unused one goes
    claimed.release()
    hydra.mkdir()
    copied, claimed = claim(SimpleNamespace(path=tmp_path / "mine", run_dir=None))
    assert copied == hydra and said == [
        f"resume: {tmp_path / 'mine'} is not inside a run directory; the run goes on in a new one, {hydra}"
    ]
    claimed.release()
    (hydra / ".owner").unlink()
    if os.geteuid() != 0:  # root writes anywhere: the read-only case needs another user
        run.chmod(0o500)
        try:
            beside, claimed = claim(SimpleNamespace(path=run / "checkpoints" / "step_1", run_dir=run))
            assert beside == hydra and "permission denied" in said[-1] and str(hydra) in said[-1]
            claimed.release()
        finally:
            run.chmod(0o700)


def test_a_time_budget_probe_times_a_real_save_and_leaves_nothing(tmp_path, tiny_data_cache):
    """Checkpointer.time_one writes a whole checkpoint where no loader looks, and removes it: no step_N appears."""
    from model import ModelConfig, Transformer
    from training.checkpoint import Checkpointer, RunState, run_checkpoints
    from training.distributed import DistInfo

    cfg = ModelConfig(vocab_size=512, hidden_size=32, n_layers=1, n_heads=2, max_seq_len=16)
    model = Transformer(cfg)
    optimizer = torch.optim.AdamW(model.parameters())
    tokenizer = next(tiny_data_cache.glob("*/tokenizer.json"))
    saver = Checkpointer(tmp_path, model, [optimizer], tokenizer, cfg, "seed: 0\n", 3, DistInfo(), RunState())
    assert saver.time_one() > 0
    checkpoints = tmp_path / "checkpoints"
    assert run_checkpoints(checkpoints) == [] and not [p for p in checkpoints.rglob("*") if p.is_file()]
