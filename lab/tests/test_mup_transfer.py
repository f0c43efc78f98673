"""The μP transfer experiment (lab/mup_transfer.py): the default
plan is the issue's grid and every cell composes; the runner records each run once, continues where it
stopped, moves a cut-off run aside; the report finds each width's best lr; one tiny real run end to end."""

import dataclasses
import json
import math
import re
import subprocess

import pytest

import lab.launcher
from lab import CONFIGS
from lab import mup_transfer as program
from lab.launcher import COMPLETED, FAILED, NOT_RUN, Ended, write_job_status, write_option
from lab.mup_transfer import (
    DIVERGED,
    FINISHED,
    Cell,
    TransferError,
    TransferSpec,
    best_lrs,
    markdown,
    mean_losses,
    open_experiment,
    read_results,
    run_cells,
    write_report,
)
from tests import forked
from tests.run_helpers import BPB_TO_LOSS, write_run
from training.program import compose_train_config


@pytest.fixture
def forking(monkeypatch):
    """The experiment's train.py runs fork from the preloaded server (tests/forked.py): real processes, ~3 s cheaper each."""
    monkeypatch.setattr(lab.launcher.subprocess, "Popen", forked.popen_forking_train_py(subprocess.Popen))


SMALL = TransferSpec(widths=(32, 64), lrs=(0.01, 0.02, 0.04), seeds=(0,), optimizers=("adamw",))


def test_the_default_plan_is_the_issues_grid_and_every_cell_composes(tmp_path):
    spec = TransferSpec()
    assert len(spec.widths) >= 4 and (min(spec.widths), max(spec.widths)) == (64, 512) and len(spec.seeds) >= 2
    assert len(spec.lrs) >= 5 and all(b == 2 * a for a, b in zip(spec.lrs, spec.lrs[1:]))
    cells = spec.cells()
    assert len(cells) == len({c.name for c in cells}) == 2 * 2 * 4 * 5 * 2
    budgets = set()
    for cell in {(c.optimizer, c.parametrization, c.width): c for c in cells}.values():
        write_option(tmp_path, cell.job(tmp_path / cell.name, spec.min_lr_ratio))
        searchpath = f"hydra.searchpath=[file://{tmp_path},file://{CONFIGS}]"
        cfg, _ = compose_train_config([searchpath, f"experiment={spec.experiment}", f"+job={cell.name}"])
        assert (cfg.optim.name, cfg.model.parametrization, cfg.model.hidden_size) == (
            cell.optimizer,
            cell.parametrization,
            cell.width,
        )
        assert (cfg.optim.lr, cfg.optim.min_lr, cfg.model.mup_base_width) == (cell.lr, cell.lr * 0.1, 64)
        budgets.add(cfg.trainer.max_steps * cfg.trainer.micro_batch_size * cfg.trainer.seq_len)
    assert len(budgets) == 1  # one token budget at every width


STOPPED = "stopped"


class FakeLauncher:
    """lab/launcher.py's Launcher without train.py: each job's run directory written as it would end (finished with
    the given val loss, diverged for None), and none started after a STOPPED one."""

    def __init__(self, losses: dict, calls: list):
        self.losses, self.calls = losses, calls

    def run(self, jobs, root):
        for job in jobs:
            cell = Cell(
                job.choices["optim"],
                job.values["model"]["parametrization"],
                job.values["model"]["hidden_size"],
                job.values["optim"]["lr"],
                job.values["seed"],
            )
            self.calls.append(cell.name)
            value = self.losses.get((cell.parametrization, cell.width, cell.lr), 3.0)
            if value == STOPPED:
                yield Ended(job, NOT_RUN, exit_code=130)
                return
            if value is None:
                job.run_dir.mkdir(parents=True)
                write_job_status(
                    job.run_dir, {"status": FAILED, "error": "non-finite loss", "error_types": ["NonFiniteLoss"]}
                )
                yield Ended(job, FAILED, exit_code=1, wall_s=1.0)
                continue
            write_run(job.run_dir.parent, job.run_dir.name, bpb=value / BPB_TO_LOSS)
            write_job_status(job.run_dir, {"status": COMPLETED})
            yield Ended(job, COMPLETED, wall_s=1.0)


def fake_training(losses: dict, calls: list) -> FakeLauncher:
    return FakeLauncher(losses, calls)


def test_one_run_at_a_time_trains_each_seeds_narrow_runs_first_so_every_wide_run_ends_paired(tmp_path):
    spec = open_experiment(
        tmp_path,
        TransferSpec(
            widths=(64, 512), lrs=(0.01, 0.02), seeds=(0, 1), optimizers=("adamw",), parametrizations=("mup",)
        ),
    )
    calls = []
    run_cells(spec, tmp_path, fake_training({}, calls), say=lambda *a, **k: None, one_at_a_time=True)
    assert calls == [
        Cell("adamw", "mup", width, lr, seed).name for seed in (0, 1) for width in (64, 512) for lr in (0.01, 0.02)
    ]
    assert [c.width for c in spec.cells()][:2] == [512, 512]  # parallel jobs: the long runs first


def test_the_runner_records_each_run_once_and_continues_where_it_stopped(tmp_path):
    spec = open_experiment(tmp_path, SMALL)
    calls = []
    (tmp_path / "runs" / SMALL.cells()[0].name).mkdir(parents=True)  # a run cut off by a kill
    stop_at = {("mup", 32, 0.02): STOPPED, ("sp", 64, 0.04): None}
    assert run_cells(spec, tmp_path, fake_training(stop_at, calls), say=lambda *a, **k: None) == 130
    assert calls[-1] == Cell("adamw", "mup", 32, 0.02, 0).name  # nothing starts after a stop
    assert len(list((tmp_path / "discarded").glob("*/*"))) == 1  # moved aside, never deleted
    results = read_results(tmp_path)
    assert len(results) == len(calls) - 1 and results[Cell("adamw", "sp", 64, 0.04, 0).name]["val_loss"] is None
    calls.clear()
    assert run_cells(spec, tmp_path, fake_training({}, calls), say=lambda *a, **k: None) == 0
    assert len(read_results(tmp_path)) == len(SMALL.cells()) and len(calls) == len(SMALL.cells()) - len(results)
    calls.clear()
    assert run_cells(spec, tmp_path, fake_training({}, calls), say=lambda *a, **k: None) == 0 and calls == []


def test_a_directory_keeps_its_plan_and_a_dry_run_writes_nothing(tmp_path):
    assert open_experiment(tmp_path / "new", SMALL, create=False) == SMALL and not (tmp_path / "new").exists()
    open_experiment(tmp_path / "exp", SMALL)
    assert open_experiment(tmp_path / "exp", None) == SMALL
    with pytest.raises(TransferError, match="was started with another plan"):
        open_experiment(tmp_path / "exp", TransferSpec())
    grown = dataclasses.replace(SMALL, lrs=(*SMALL.lrs, 0.08))  # a grid past its edge: the plan may grow
    assert open_experiment(tmp_path / "exp", grown, create=False) == grown
    assert open_experiment(tmp_path / "exp", None) == SMALL  # a dry run wrote nothing
    assert open_experiment(tmp_path / "exp", grown) == grown and open_experiment(tmp_path / "exp", None) == grown
    for shrunk in (SMALL, dataclasses.replace(grown, overrides=("trainer.max_steps=9",))):
        with pytest.raises(TransferError, match="keeps every width, lr"):  # dropped points or other settings
            open_experiment(tmp_path / "exp", shrunk)
    with pytest.raises(TransferError, match="two or more positive widths"):
        TransferSpec(widths=(64,))


def test_the_report_finds_each_widths_best_lr_and_how_far_it_moved(tmp_path):
    spec = open_experiment(tmp_path, SMALL)
    losses = {("mup", w, lr): abs(math.log2(lr / 0.02)) + 3 for w in (32, 64) for lr in SMALL.lrs}  # best 0.02
    losses.update({("sp", 32, lr): abs(math.log2(lr / 0.04)) + 3 for lr in SMALL.lrs})  # SP: 0.04, then 0.01
    losses.update({("sp", 64, lr): abs(math.log2(lr / 0.01)) + 3 for lr in SMALL.lrs})
    losses[("sp", 64, 0.04)] = None  # diverged
    run_cells(spec, tmp_path, fake_training(losses, []), say=lambda *a, **k: None)
    table = mean_losses(spec, read_results(tmp_path))
    assert best_lrs(table) == {("adamw", "mup"): {32: 0.02, 64: 0.02}, ("adamw", "sp"): {32: 0.04, 64: 0.01}}
    text = markdown(spec, table)
    assert "AdamW · μP: best lr moved 2^+0 from width 32 to 64\n" in text  # interior: no edge warning
    assert "2^-2 from width 32 to 64 (at the grid's edge at width 32, 64: the optimum may lie beyond it)" in text
    assert "AdamW · SP: best lr moved 2^-2 from width 32 to 64" in text and "| 64 | **3.0000** | 4.0000 | × |" in text
    two_seeds = TransferSpec(
        widths=(32, 64), lrs=(0.01,), seeds=(0, 1), optimizers=("adamw",), parametrizations=("sp",)
    )
    rows = {
        Cell("adamw", "sp", 32, 0.01, s).name: {"status": status, "val_loss": v}
        for s, status, v in ((0, FINISHED, 3.0), (1, DIVERGED, None))
    }
    rows.update({Cell("adamw", "sp", 64, 0.01, s).name: {"status": FINISHED, "val_loss": 3.0 + s} for s in (0, 1)})
    assert mean_losses(two_seeds, rows) == {("adamw", "sp"): {32: {0.01: None}, 64: {0.01: 3.5}}}  # one diverged seed
    written = write_report(spec, tmp_path)
    assert all(path.stat().st_size > 0 for path in written)


@pytest.mark.serial  # trains (tiny): one at a time under make test's two workers
def test_a_tiny_experiment_runs_end_to_end_and_a_rerun_has_nothing_to_do(tmp_path, tiny_data_cache, capsys, forking):
    args = [
        "--dir",
        str(tmp_path / "exp"),
        "--widths",
        "32,64",
        "--lrs",
        "0.01",
        "--seeds",
        "0",
        "--optimizers",
        "adamw",
        "--parametrizations",
        "mup",
        "--jobs",
        "1",
        "--set",
        "trainer.max_steps=3",
        "--set",
        "trainer.eval_windows=2",
        "--set",
        "data.vocab_size=512",
        "--set",
        "model.mup_base_width=32",
        "--set",
        f"data.cache_dir={tiny_data_cache}",
    ]
    assert program.main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "exp" / "results.jsonl").read_text().splitlines()]
    assert [(r["width"], r["status"]) for r in rows] == [(32, FINISHED), (64, FINISHED)]  # --jobs 1: narrow first
    assert all(math.isfinite(r["val_loss"]) for r in rows)
    run = tmp_path / "exp" / "runs" / rows[1]["cell"]
    assert "parametrization mup (m = 2 over base width 32)" in (run.parent / f"{run.name}.log").read_text()
    assert not (run / "checkpoints").exists() and (tmp_path / "exp" / "transfer.png").exists()
    assert "## AdamW · μP: best lr moved 2^+0 from width 32 to 64" in (tmp_path / "exp" / "results.md").read_text()
    assert program.main(["--dir", str(tmp_path / "exp"), "--jobs", "1"]) == 0  # the plan comes from spec.json
    assert "2 runs done, 0 to do" in capsys.readouterr().out
    assert program.main(["--dir", str(tmp_path / "exp"), "--dry-run", "--jobs", "1"]) == 0
    assert "per run from the runs finished here" in capsys.readouterr().out


def test_a_dry_run_prices_each_optimizer_and_width_from_a_timing_run_and_writes_nothing(
    tmp_path, tiny_data_cache, capsys, forking
):
    args = ["--dir", str(tmp_path / "exp"), "--widths", "32,64", "--lrs", "0.01", "--seeds", "0", "--optimizers"]
    args += ["adamw", "--parametrizations", "mup", "--jobs", "1", "--dry-run", "--probe-steps", "2"]
    for value in ("trainer.max_steps=3", "trainer.eval_windows=2", "data.vocab_size=512", "model.mup_base_width=32"):
        args += ["--set", value]
    assert program.main([*args, "--set", f"data.cache_dir={tiny_data_cache}"]) == 0
    out = capsys.readouterr().out
    assert "cost, per run from a 2-step timing run of each optimizer and width:" in out
    assert re.search(r"adamw width 64: \d+ s per run × 1 runs", out) and not (tmp_path / "exp").exists()
