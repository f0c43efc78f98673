"""lab/launcher.py, the one way a study runs training: a job's generated option composes to what its
overrides would, the multirun command, jobs in one process or `workers` processes at a time with their
outcomes read back, Ctrl-C passed on exactly once and its exit status."""

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from lab import CONFIGS, SEARCH_PATH
from lab.launcher import (
    COMPLETED,
    FAILED,
    NOT_RUN,
    TRAIN_PY,
    Job,
    Launcher,
    read_job_status,
    write_job_status,
    write_option,
)
from lab.mup_transfer import Cell
from tests import forked
from training.checkpoint import RunFiles
from training.program import compose_train_config


def stand_in(tmp_path: Path, code: str) -> str:
    """An executable that takes the place of `python` before train.py: it runs `code` with the launcher's
    arguments in sys.argv (train.py's among them), and helpers to find its run directory."""
    path = tmp_path / "python-stand-in"
    path.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent("""
        import os, signal, sys, time
        from pathlib import Path
        arg = lambda key: next(a.split("=", 1)[1] for a in sys.argv if a.startswith(key + "="))
        run_dir = lambda: Path(arg("hydra.sweep.dir")) / arg("hydra.sweep.subdir").strip("'")
    """)
        + textwrap.dedent(code)
    )
    path.chmod(0o755)
    return str(path)


CHILD = """
    got = []
    signal.signal(signal.SIGINT, lambda *a: got.append(1))
    print("ready", flush=True)
    deadline = time.time() + 20
    while not got and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a second copy of the signal would arrive now
    print(f"got {len(got)}", flush=True)
"""

PARENT = """
    import sys
    from pathlib import Path
    from lab.launcher import Job, Launcher
    launcher = Launcher(Path({tmp!r}) / "options", one_process=True, python={python!r})
    list(launcher.run([Job(Path({tmp!r}) / "runs" / "a")]))
    sys.exit(launcher.status)
"""


def parent_process(tmp_path, child: str, new_session: bool = False) -> forked.ForkedRun:
    """PARENT as a real process forked from the preloaded server (tests/forked.py: no torch import to pay), in a
    session of its own if new_session."""
    code = textwrap.dedent(PARENT).format(tmp=str(tmp_path), python=stand_in(tmp_path, child))
    script = tmp_path / "parent.py"
    script.write_text(("import os\nos.setsid()\n" if new_session else "") + code)
    return forked.ForkedRun([str(script)], dict(os.environ), forked.REPO)


def first_line(proc: forked.ForkedRun, timeout: float = 60) -> str:
    """The first line the process wrote (its output is a file, read as it grows)."""
    deadline = time.time() + timeout
    while "\n" not in proc.stdout.read() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    return proc.stdout.read().split("\n")[0]


@pytest.mark.parametrize("to_group", [True, False], ids=["terminal-ctrl-c", "kill-the-study"])
def test_ctrl_c_reaches_the_jobs_exactly_once(tmp_path, to_group):
    """A terminal's Ctrl-C goes to the whole foreground process group. The jobs run in a session of their
    own, so each gets the SIGINT once, passed on by the study — twice would mean 'stop now, without a
    checkpoint' to train.py. Signalling the study's process alone works the same."""
    parent = parent_process(tmp_path, CHILD, new_session=True)  # a stand-in for the foreground group
    assert first_line(parent) == "ready"
    if to_group:
        os.killpg(parent.pid, signal.SIGINT)
    else:
        parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=30) == 128 + signal.SIGINT  # stopped on request
    assert parent.stdout.read().split() == ["ready", "got", "1"]  # the job saw the SIGINT exactly once


def test_a_signal_death_is_reported_as_128_plus_the_signal(tmp_path):
    launcher = Launcher(tmp_path / "options", python=stand_in(tmp_path, "os.kill(os.getpid(), signal.SIGTERM)"))
    (ended,) = launcher.run([Job(tmp_path / "runs" / "a")])
    assert ended.exit_code == launcher.status == 128 + signal.SIGTERM and ended.status == NOT_RUN


def test_a_stop_request_wins_over_the_multiruns_own_exit_status(tmp_path):
    """A Ctrl-C that lands between two jobs makes Hydra exit 1 (KeyboardInterrupt), not 130: the
    study still reports it as stopped, so it prints how to continue instead of an error."""
    child = "signal.signal(signal.SIGINT, lambda *a: sys.exit(1)); print('ready', flush=True); time.sleep(20)"
    parent = parent_process(tmp_path, child)
    assert first_line(parent) == "ready"
    parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=30) == 128 + signal.SIGINT


# Each stand-in job sleeps a little, records when it ran, and ends as its run directory's name says.
JOB = """
    directory = run_dir()
    start = time.time(); time.sleep(0.3)
    directory.mkdir(parents=True)
    (directory.parent / (directory.name + ".span")).write_text(f"{start} {time.time()}")
    status = {"COMPLETED": "status: COMPLETED", "FAILED": "status: FAILED\\nerror: it broke\\nerror_types: [X, Y]"}
    print("log line", flush=True)
    if not directory.name.startswith("DIES"):
        (directory / "job_status.yaml").write_text(status[directory.name.split("_")[0]])
"""


def test_jobs_run_workers_at_a_time_each_with_its_log_and_outcome(tmp_path):
    jobs = [Job(tmp_path / "runs" / name) for name in ("COMPLETED_a", "FAILED_b", "COMPLETED_c", "DIES_d")]
    launcher = Launcher(tmp_path / "options", ["seed=3"], workers=2, python=stand_in(tmp_path, JOB))
    ended = {e.job.option: e for e in launcher.run(jobs)}
    assert {k: e.status for k, e in ended.items()} == {
        "COMPLETED_a": COMPLETED,
        "FAILED_b": FAILED,
        "COMPLETED_c": COMPLETED,
        "DIES_d": NOT_RUN,
    }
    assert (ended["FAILED_b"].error, ended["FAILED_b"].error_types) == ("it broke", ("X", "Y"))
    assert all(e.wall_s >= 0.3 for e in ended.values())
    assert all((tmp_path / "runs" / f"{name}.log").read_text() == "log line\n" for name in ended)
    spans = sorted(tuple(map(float, (tmp_path / "runs" / f"{name}.span").read_text().split())) for name in ended)
    overlapping = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert overlapping == 2  # two at a time: never more, and not one after another


def test_the_multirun_command_puts_each_job_in_its_directory(tmp_path):
    launcher = Launcher(
        tmp_path / "configs",
        ["experiment=ablation_protocol", "trainer.max_steps=5"],
        one_process=True,
        cluster=["hydra/launcher=submitit_slurm"],
        python="py",
    )
    root = tmp_path / "with space" / "runs"
    command = launcher.command([Job(root / "a" / "x", name="a"), Job(root / "b", name="b")], root)
    assert command[:6] == [
        "py",
        str(TRAIN_PY),
        "-m",
        "experiment=ablation_protocol",
        "trainer.max_steps=5",
        "hydra/launcher=submitit_slurm",
    ]
    assert "hydra.sweep.subdir=${run_name}" in command and command[-1] == "+job=a,b"
    assert f"hydra.sweep.dir='{root}'" in command  # quoted for Hydra's grammar
    assert f"hydra.searchpath=[file://{tmp_path / 'configs'},file://{CONFIGS}]" in command
    assert any(c.endswith("=lab.launcher.JobStatusFile") for c in command)
    one = launcher.command([Job(root / "a" / "x", name="a")], root)
    assert "hydra.sweep.subdir=a/x" in one  # one job: its own directory, whatever its run_name
    with pytest.raises(ValueError, match="share a name"):
        list(launcher.run([Job(root / "a", name="a"), Job(root / "b", name="a")]))


def test_a_job_composes_to_what_its_overrides_would(tmp_path):
    """μP's runs choose a config group (optim=muon) and set values: as a generated option they must make
    the same TrainConfig as the same settings on train.py's command line."""
    cell = Cell("muon", "mup", 128, 0.004, 1)
    write_option(tmp_path, cell.job(tmp_path / "runs" / cell.name, 0.1))
    text = (tmp_path / "job" / f"{cell.name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    assert yaml.safe_load(text)["defaults"] == [{"override /optim": "muon"}, "_self_"]
    as_job, _ = compose_train_config(
        [
            "experiment=mup_transfer",
            "trainer.max_steps=7",
            f"hydra.searchpath=[file://{tmp_path},file://{CONFIGS}]",
            f"+job={cell.name}",
        ]
    )
    overrides = ["optim=muon", "model.parametrization=mup", "model.hidden_size=128", "optim.lr=0.004", "seed=1"]
    as_overrides, _ = compose_train_config(
        [SEARCH_PATH, "experiment=mup_transfer", "trainer.max_steps=7", *overrides, "optim.min_lr=0.0004"]
    )
    assert as_job == as_overrides and as_job.optim.name == "muon" and as_job.trainer.max_steps == 7


@pytest.mark.parametrize(
    "text, expected",
    [(None, None), ("status: COMPLETED\n", {"status": "COMPLETED"}), ("[1, 2]\n", None), ("status: [\n", None)],
)
def test_job_status_reads_back_or_is_none(tmp_path, text, expected):
    """A job killed before its status (no file), or a status that is not a mapping, reads as None."""
    if text is not None:
        RunFiles(tmp_path).job_status.write_text(text)
    assert read_job_status(tmp_path) == expected


def test_job_status_round_trips_in_its_written_order(tmp_path):
    write_job_status(tmp_path, {"status": "FAILED", "error": "disk full", "error_types": ["OSError"]})
    assert read_job_status(tmp_path) == {"status": "FAILED", "error": "disk full", "error_types": ["OSError"]}
    assert list(yaml.safe_load(RunFiles(tmp_path).job_status.read_text())) == ["status", "error", "error_types"]
