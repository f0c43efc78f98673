"""training/log.py's Logger (and the metrics.jsonl it writes): offline without a key, never a login prompt,
a resume (the loop's rewind_metrics after Resume.restore) drops the rows after its step, rank 0 alone writes."""

import errno
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from data import DataConfig
from training.checkpoint import RunState
from training.config import LoggerConfig, TrainerConfig
from training.distributed import DistInfo
from training.log import Logger, MetricsError, WriteError, read_metrics, rewind_metrics, wandb_mode, wandb_values


def RunLogger(
    run_dir: Path,
    cfg: LoggerConfig,
    run_name: str,
    config: dict,
    enabled: bool,
    resume_step=None,
    trainer=None,
    state=None,
):
    """The loop's Logger for a run in run_dir, on rank 0 (enabled) or rank 1, resuming at resume_step."""
    run_cfg = SimpleNamespace(trainer=trainer or TrainerConfig(), logger=cfg, run_name=run_name, data=DataConfig())
    state = state or RunState(step=resume_step or 0, max_steps=100)
    if resume_step is not None and enabled:
        rewind_metrics(run_dir, resume_step)  # what the loop does on rank 0 after Resume.restore, before its Logger
    return Logger(
        run_dir,
        run_cfg,
        yaml.safe_dump(config),
        DistInfo(rank=0 if enabled else 1),
        state,
        None,
        tokens_per_step=100,
        flops_per_token=1.0,
        peak=1.0,
        epoch_tokens=1000,
        train_tokens=1000,
    )


@pytest.fixture
def no_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))


def test_auto_is_offline_without_a_key(no_key):
    mode, warning = wandb_mode("auto")
    assert mode == "offline" and "no API key" in warning


def test_auto_is_online_with_a_key(no_key, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == ("online", None)


def test_online_without_key_and_unknown_modes_are_errors(no_key):
    with pytest.raises(ValueError, match="no API key"):
        wandb_mode("online")
    with pytest.raises(ValueError, match="logger.wandb='cloud' is unknown"):
        wandb_mode("cloud")


def test_offline_run_logs_to_jsonl_and_wandb_dir(no_key, tmp_path):
    log = RunLogger(tmp_path, LoggerConfig(wandb="offline"), "t", {"a": 1}, enabled=True)
    for step in (1, 2, 3):
        log.log({"kind": "train", "step": step, "loss": 1.0 / step, "rms_residual": [1.0, 2.0]})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    # A resume from step 2 drops the rows the resumed run will write again.
    RunLogger(tmp_path, LoggerConfig(wandb="disabled"), "t", {}, enabled=True, resume_step=2).close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


def test_wandb_files_the_run_under_its_project_name_group_and_tags_with_the_config(no_key, tmp_path, monkeypatch):
    """What wandb's UI files and filters a run by: logger.project, the run's name, logger.group, logger.tags and
    the resolved config — offline without a key, in the run directory. wandb.init itself is faked."""
    import wandb

    from training.log import open_wandb

    seen = {}
    monkeypatch.setattr(wandb, "init", lambda **kwargs: seen.update(kwargs) or "the run")
    cfg = LoggerConfig(wandb="auto", project="p", group="g", tags=["norm=rmsnorm", "seed=0"])
    assert open_wandb(tmp_path, cfg, "r", {"model": {"hidden_size": 8}}) == "the run"
    assert {k: seen[k] for k in ("project", "name", "group", "tags", "config", "mode", "dir")} == {
        "project": "p",
        "name": "r",
        "group": "g",
        "tags": ["norm=rmsnorm", "seed=0"],
        "config": {"model": {"hidden_size": 8}},
        "mode": "offline",
        "dir": str(tmp_path),
    }


def test_non_main_ranks_write_nothing(tmp_path):
    log = RunLogger(tmp_path, LoggerConfig(wandb="offline"), "t", {}, enabled=False)
    log.log({"kind": "train", "step": 1})
    log.close()
    assert not list(tmp_path.iterdir())


def test_per_layer_lists_reach_wandb_as_one_series_per_layer():
    row = {"kind": "eval", "step": 7, "time": 1.0, "val_loss": 2.5, "rms_residual": [0.5, 1.5] + [2.0] * 9}
    values = wandb_values(row)
    assert values["eval/val_loss"] == 2.5
    assert values["eval/rms_residual/layer_00"] == 0.5 and values["eval/rms_residual/layer_10"] == 2.0
    assert len([k for k in values if k.startswith("eval/rms_residual/")]) == 11
    assert not {"eval/step", "eval/time", "eval/rms_residual"} & values.keys()


def write_rows(path, steps):
    path.write_text("".join(json.dumps({"kind": "train", "step": s, "loss": 1.0}) + "\n" for s in steps))


@pytest.mark.parametrize(
    "tail", ['{"kind": "train", "step": 6, "lo', "\x00\x00\x00\x00", '{"kind": "train", "step": 6, "loss": 1.0']
)
def test_a_cut_off_last_line_is_dropped_on_resume(tmp_path, capsys, tail):
    """kill -9 mid-write leaves half a row (or, after a crash of the machine, NULs) at the end."""
    metrics = tmp_path / "metrics.jsonl"
    write_rows(metrics, range(1, 6))
    metrics.write_text(metrics.read_text() + tail)
    log = RunLogger(tmp_path, LoggerConfig(wandb="disabled"), "t", {}, enabled=True, resume_step=4)
    log.log({"kind": "train", "step": 5, "loss": 0.5})
    log.close()
    assert f"warning: {metrics}: dropped its cut-off last line 6" in capsys.readouterr().err
    assert [(r["step"], r["loss"]) for r in read_metrics(metrics)] == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 0.5)]
    assert all(json.loads(line) for line in metrics.read_text().splitlines())  # every line whole again


def test_corruption_before_the_last_line_is_an_error(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    write_rows(metrics, range(1, 6))
    lines = metrics.read_text().splitlines()
    lines[2] = lines[2][:10]
    metrics.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        MetricsError,
        match=rf"^{metrics} line 3 is not a JSON object .* but more rows follow it; the "
        "file is corrupt: fix or delete that line, then resume$",
    ):
        RunLogger(tmp_path, LoggerConfig(wandb="disabled"), "t", {}, enabled=True, resume_step=4)
    assert len(metrics.read_text().splitlines()) == 5  # left as it was for the user to look at


def test_a_full_disk_while_logging_is_one_line(tmp_path):
    log = RunLogger(tmp_path, LoggerConfig(wandb="disabled"), "t", {}, enabled=True)

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    log.file = FullDisk()
    with pytest.raises(
        WriteError,
        match=rf"^cannot write metrics: no space left on device while writing "
        rf"{tmp_path}/metrics.jsonl; free space on the disk holding {tmp_path}",
    ):
        log.log({"kind": "train", "step": 1})


def test_the_progress_bar_has_no_end_until_a_time_budget_plans_one(tmp_path):
    """Before its first plan a budgeted run's bar shows no length (not max_steps' 1000, which it will not run);
    a resume of a planned run shows its planned end; a run without a budget shows max_steps."""
    off = LoggerConfig(wandb="disabled")
    for name in "abc":
        (tmp_path / name).mkdir()
    budgeted = TrainerConfig(time_budget=10.0, max_steps=1000)
    assert (
        RunLogger(tmp_path / "a", off, "t", {}, True, trainer=budgeted, state=RunState(max_steps=1000)).progress.total
        is None
    )
    planned = RunState(step=50, max_steps=1000)
    planned.plan_budget(10.0, 1234, 0.3, 20.0, 60)
    assert RunLogger(tmp_path / "b", off, "t", {}, True, trainer=budgeted, state=planned).progress.total == 1234
    assert (
        RunLogger(
            tmp_path / "c", off, "t", {}, True, trainer=TrainerConfig(max_steps=1000), state=RunState(max_steps=1000)
        ).progress.total
        == 1000
    )


def test_wandbs_notice_comes_before_the_progress_bar(tmp_path, monkeypatch):
    """The notice (stderr) once came after the bar was drawn (stdout), glued to it: `train: 0step […]wandb: …`."""
    import training.log as L

    order = []
    monkeypatch.setattr(L, "open_wandb", lambda *a, **k: order.append("wandb"))
    real_tqdm = L.tqdm
    monkeypatch.setattr(L, "tqdm", lambda *a, **k: order.append("bar") or real_tqdm(*a, **k))
    RunLogger(tmp_path, LoggerConfig(wandb="offline"), "t", {}, enabled=True).close()
    assert order == ["wandb", "bar"]
