"""Fault injection: kills, signals, NaNs and concurrent starts against the real train.py, and what survives.

Every test drives train.py in a subprocess as a user (or a scheduler) would; faults come from
outside (kill -9, signals) or from tests/fault_injection.py, which patches library calls before
train.py starts. docs/reliability.md lists each failure with the test that holds it.
"""

import multiprocessing as mp
import random
import signal
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.data_helpers import make_documents, write_local
from tests.test_run_dir import claim_and_hold
from tests.train_helpers import read_metrics, run_dirs, run_faulty, run_ranks, run_train, wait_for_step

pytestmark = pytest.mark.serial  # trains: one at a time under make test's two workers (tests/fixtures.py)

# fp32 (bitwise comparisons), dropout on (so the RNG state matters on resume), every step logged.
EXACT = ["trainer.precision=fp32", "model.dropout=0.1", "trainer.log_interval=1"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, tiny_data_cache):
    """A data cache of this module's own (faults may hit it), starting with the session's prepared one."""
    import shutil

    return shutil.copytree(tiny_data_cache, tmp_path_factory.mktemp("data_cache"), dirs_exist_ok=True)


def weights(ckpt):
    return load_file(ckpt / "model.safetensors")


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def train_losses(run):
    return {r["step"]: r["loss"] for r in read_metrics(run) if r["kind"] == "train"}


def test_kill9_at_random_steps_then_resume_is_bitwise_identical(tmp_path, cache_dir):
    """A planned stop (stop_at_step), then kill -9 at three seeded random steps, each followed by
    `resume=<run dir>`: the final weights and every logged loss equal an uninterrupted run's."""
    args = [*EXACT, "trainer.max_steps=24", "trainer.ckpt_interval=3", "trainer.eval_interval=12"]
    run_train(tmp_path / "full", *args, cache_dir=cache_dir)
    (full,) = run_dirs(tmp_path / "full")
    part_root = tmp_path / "part"
    stopped = run_train(part_root, *args, "trainer.stop_at_step=5", cache_dir=cache_dir)
    (run,) = run_dirs(part_root)
    assert f"stopped at trainer.stop_at_step=5; continue with: python train.py resume={run}" in stopped.stdout
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == [
        "step_0000003",
        "step_0000005",
    ]  # the stop saves
    kill_steps = sorted(random.Random(0).sample(range(7, 23), 3))  # ≥ 3 kills, at seeded "random" steps
    for kill_at in kill_steps:
        proc = run_train(part_root, *args, f"resume={run}", cache_dir=cache_dir, popen=True)
        wait_for_step(part_root / "outputs", kill_at, proc)
        proc.kill()  # SIGKILL: no handler, no cleanup, possibly mid-step or mid-save
        proc.wait()
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 9')  # as if killed in the middle of writing a row
    resumed = run_train(part_root, *args, f"resume={run}", cache_dir=cache_dir)
    assert "dropped its cut-off last line" in resumed.stderr
    assert run_dirs(part_root) == [run]
    assert_same_weights(full / "checkpoints" / "step_0000024", run / "checkpoints" / "step_0000024")
    assert train_losses(full) == train_losses(run)  # rows after the resumed checkpoint were re-logged
    # Resuming from an older checkpoint abandons the later ones: moved aside, never picked again.
    older = run / "checkpoints" / "step_0000021"
    again = run_train(part_root, *args, f"resume={older}", cache_dir=cache_dir)
    assert "moved 2 later checkpoint(s) of the abandoned branch" in again.stdout, again.stdout
    (abandoned,) = (run / "checkpoints").glob("abandoned-*")  # the step and the best checkpoint after step 21
    assert sorted(str(p.relative_to(abandoned)) for p in abandoned.glob("**/step_*")) == [
        "best/step_0000024",
        "step_0000024",
    ]
    assert_same_weights(full / "checkpoints" / "step_0000024", run / "checkpoints" / "step_0000024")


def test_kill9_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, cache_dir):
    marker = tmp_path / "in_save"
    proc = run_faulty(
        tmp_path,
        {"hang_in_save": str(marker)},
        *EXACT,
        "trainer.max_steps=8",
        "trainer.ckpt_interval=4",
        "trainer.stop_at_step=8",
        "trainer.eval_interval=8",
        cache_dir=cache_dir,
        popen=True,
    )
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1][-2000:]
    proc.kill()
    proc.wait()
    (run,) = run_dirs(tmp_path)
    ckpts = run / "checkpoints"
    assert [p.name for p in ckpts.iterdir()] == ["step_0000004.tmp"]  # killed in the first save: nothing else
    # Resume finds no complete checkpoint: one line, nothing touched.
    proc = run_train(tmp_path, f"resume={run}", cache_dir=cache_dir, check=False)
    assert proc.returncode == 1 and "has no complete checkpoint" in proc.stderr.splitlines()[-1]


def test_concurrent_starts_never_share_a_run_directory(tmp_path):
    # One directory for both (as two runs started in the same second get): the second must move.
    # Both start with a cold data cache too: one builds it, the other waits for it.
    same = "hydra.run.dir=" + str(tmp_path / "outputs" / "runs" / "r")
    corpus = write_local(tmp_path / "corpus", make_documents(300), "txt")  # small: built in a second or two
    args = [
        "trainer.precision=fp32",
        "trainer.max_steps=20",
        same,
        "trainer.eval_interval=20",
        "data=local",
        f"data.path={corpus}",
    ]
    cache = tmp_path / "cold_cache"
    # The build is made 3 s slower, so the second start always finds it under way (a cache already built
    # would be a plain hit, and the waiting this test holds would go untested).
    procs = [
        run_faulty(tmp_path, {"slow_prepare": 3}, *args, f"seed={seed}", cache_dir=cache, popen=True) for seed in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert sum("data: waiting for another process preparing data" in err for _, err in outs) == 1
    dirs = sorted(p for p in (tmp_path / "outputs" / "runs").iterdir())
    assert [d.name for d in dirs] == ["r", "r-1"]
    seeds = {}
    for run in dirs:  # each directory holds exactly one run: one seed everywhere, steps logged once
        seed = yaml.safe_load(run.joinpath("config.yaml").read_text())["seed"]
        seeds[seed] = run / "checkpoints" / "step_0000020"
        assert yaml.safe_load((seeds[seed] / "config.yaml").read_text())["seed"] == seed
        assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == [5, 10, 15, 20]
    assert sorted(seeds) == [0, 1]
    # And the weights are seed 1's own (not the other run's, as a shared directory gave).
    run_train(tmp_path / "alone", *args[:2], *args[3:], "seed=1", cache_dir=cache)
    (alone,) = run_dirs(tmp_path / "alone")
    assert_same_weights(alone / "checkpoints" / "step_0000020", seeds[1])


def test_a_run_that_loses_the_claim_leaves_the_winners_directory_alone(tmp_path, cache_dir):
    """The winner of a shared directory has claimed it but written nothing else yet (it is still preparing
    data): the loser moves to `r-1` and must not remove `r` as a directory nobody uses."""
    ctx = mp.get_context("fork")
    claimed, done = ctx.Event(), ctx.Event()
    winner = ctx.Process(target=claim_and_hold, args=(tmp_path / "outputs" / "r", claimed, done))
    winner.start()
    try:
        assert claimed.wait(30)
        loser = run_train(
            tmp_path,
            "trainer.max_steps=2",
            "trainer.eval_interval=2",
            f"hydra.run.dir={tmp_path / 'outputs' / 'r'}",
            cache_dir=cache_dir,
        )
        assert f"using {tmp_path / 'outputs' / 'r-1'}" in loser.stderr
        assert (tmp_path / "outputs" / "r" / ".owner").exists()
    finally:
        done.set()
        winner.join(30)


def test_a_run_directory_in_use_is_never_shared_nor_resumed(tmp_path, cache_dir):
    named = "hydra.run.dir=" + str(tmp_path / "outputs" / "mine")
    slow = run_train(
        tmp_path, "trainer.max_steps=100000", "trainer.log_interval=1", named, cache_dir=cache_dir, popen=True
    )
    try:
        wait_for_step(tmp_path / "outputs", 1, slow)
        second = run_train(tmp_path, "trainer.max_steps=2", "trainer.eval_interval=2", named, cache_dir=cache_dir)
        assert f"using {tmp_path / 'outputs' / 'mine-1'}" in second.stderr
        assert (tmp_path / "outputs" / "mine-1" / "checkpoints" / "step_0000002").is_dir()
        resume = run_train(tmp_path, f"resume={tmp_path / 'outputs' / 'mine'}", cache_dir=cache_dir, check=False)
        assert resume.returncode == 1 and "in use by a live run" in resume.stderr.splitlines()[-1]
    finally:
        slow.kill()
        slow.wait()


def test_nan_at_a_step_stops_naming_it_and_the_last_good_checkpoint(tmp_path, cache_dir):
    proc = run_faulty(
        tmp_path,
        {"nan_steps": [5]},
        *EXACT,
        "trainer.max_steps=20",
        "trainer.ckpt_interval=2",
        "trainer.log_interval=10",
        cache_dir=cache_dir,
        check=False,
    )
    assert proc.returncode == 1
    (run,) = run_dirs(tmp_path)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: non-finite loss or gradient at step 5")
    assert f"the last good checkpoint is {run / 'checkpoints' / 'step_0000004'}" in last
    # Checked before each save, not only at the log interval: no checkpoint at or after step 5.
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_0000002", "step_0000004"]


def test_nan_before_any_checkpoint_says_there_is_none(tmp_path, cache_dir):
    proc = run_faulty(tmp_path, {"nan_steps": [1]}, *EXACT, "trainer.max_steps=20", cache_dir=cache_dir, check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "at step 1" in last and "no checkpoint was written yet" in last
    (run,) = run_dirs(tmp_path)
    assert not (run / "checkpoints").exists()


def test_skip_nonfinite_steps_skips_the_update_and_stops_at_n_in_a_row(tmp_path, cache_dir):
    args = [*EXACT, "trainer.max_steps=12", "trainer.skip_nonfinite_steps=3", "trainer.eval_interval=12"]
    proc = run_faulty(tmp_path / "two", {"nan_steps": [5, 6]}, *args, cache_dir=cache_dir)
    (run,) = run_dirs(tmp_path / "two")
    rows = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert [r["step"] for r in rows if r["skipped_steps"]] == [5, 6] and sum(r["skipped_steps"] for r in rows) == 2
    assert "skipped 2 non-finite step(s)" in proc.stdout
    state = torch.load(run / "checkpoints" / "step_0000012" / "optimizer.pt", weights_only=True)["state"]
    assert {int(s["step"]) for s in state.values()} == {10}  # 12 steps, 2 updates skipped entirely
    assert all(torch.isfinite(w).all() for w in weights(run / "checkpoints" / "step_0000012").values())
    proc = run_faulty(tmp_path / "three", {"nan_steps": [5, 6, 7]}, *args, cache_dir=cache_dir, check=False)
    assert proc.returncode == 1 and "3 non-finite steps in a row" in proc.stderr.splitlines()[-1]


def test_a_disk_that_fills_while_logging_is_one_line_error_not_a_chained_traceback(tmp_path, cache_dir):
    proc = run_faulty(
        tmp_path, {"metrics_disk_full_after": 3}, "trainer.log_interval=1", cache_dir=cache_dir, check=False
    )
    assert proc.returncode == 1
    (run,) = run_dirs(tmp_path)
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: cannot write metrics: no space left on device while writing {run / 'metrics.jsonl'}; free space on "
        f"the disk holding {run} (or lower trainer.keep_last)"
    )
    assert "Traceback" not in proc.stderr


def test_sigterm_during_a_periodic_save_saves_once_and_exits_143(tmp_path, cache_dir):
    log = tmp_path / "saves"
    proc = run_faulty(
        tmp_path,
        {"signal_in_save": int(signal.SIGTERM), "save_log": str(log)},
        *EXACT,
        "trainer.max_steps=100",
        "trainer.ckpt_interval=4",
        cache_dir=cache_dir,
        check=False,
    )
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert log.read_text().split() == ["4"]  # the periodic save only, not a second copy of step 4
    assert "SIGTERM: checkpoint saved at step 4" in proc.stdout


def test_second_ctrl_c_stops_at_once_with_one_line_and_exit_130(tmp_path, cache_dir):
    proc = run_faulty(
        tmp_path,
        {"signal_at_step": [3, int(signal.SIGINT)], "signal_in_save": int(signal.SIGINT)},
        *EXACT,
        "trainer.max_steps=100",
        "trainer.ckpt_interval=1000",
        cache_dir=cache_dir,
        check=False,
    )
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("SIGINT: stopped at once without saving")


def test_slow_data_preparation_never_trips_the_collective_timeout(tmp_path, cache_dir):
    """Building the token cache takes longer than trainer.dist_timeout_s: the ranks prepare before they
    join the process group (one builds, the others wait on a file lock), so no collective times out."""
    # A cold cache of a small corpus: one rank really builds it (tokenizer and all) in a second or two.
    # Two ranks with the environment torchrun gives them (run_ranks), each preparing 4 s slower.
    corpus = write_local(tmp_path / "corpus", make_documents(300), "txt")
    run_ranks(
        tmp_path,
        2,
        "data=local",
        f"data.path={corpus}",
        "trainer.max_steps=4",
        "trainer.eval_interval=4",
        "trainer.dist_timeout_s=3",
        cache_dir=tmp_path / "fresh_cache",
        faults={"slow_prepare": 4},
    )
    (run,) = run_dirs(tmp_path)
    assert (run / "checkpoints" / "step_0000004").is_dir()
