"""analysis/launch.py: a cell's generated config, the multirun command, and Ctrl-C forwarding."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import yaml

from analysis.launch import cell_config, run_sweep, sweep_command, write_cells
from analysis.protocol import Cell

CELL = Cell("wide", "no_norm", 3e-3, 2)


def test_cell_config_sets_lr_schedule_seed_directory_and_wandb():
    values = {"model": {"norm": "none", "hidden_size": 128}}
    config = cell_config(CELL, values, 0.1, "ablate_x", "stage2")
    assert config["model"] == {"norm": "none", "hidden_size": 128} and values == {"model": {"norm": "none",
                                                                                            "hidden_size": 128}}
    assert config["optim"] == {"lr": 3e-3, "min_lr": pytest.approx(3e-4)}
    assert (config["seed"], config["run_name"]) == (2, "wide/no_norm/lr0.003_seed2")
    assert config["logger"] == {"group": "ablate_x", "tags": ["ablate", "stage2", "variant=no_norm", "size=wide",
                                                              "lr=0.003"]}
    assert "resume" not in config
    assert cell_config(CELL, values, 0.1, "g", "stage2", resume="/p/runs/x")["resume"] == "/p/runs/x"


def test_cells_are_global_package_configs(tmp_path):
    write_cells(tmp_path, {CELL.option: cell_config(CELL, {}, 0.1, "g", "stage1")})
    text = (tmp_path / "cell" / f"{CELL.option}.yaml").read_text()
    assert text.startswith("# @package _global_\n") and yaml.safe_load(text)["seed"] == 2


def test_sweep_command_names_each_job_directory_after_its_cell(tmp_path):
    command = sweep_command("py", tmp_path / "train.py", "ablation_protocol", ["trainer.max_steps=5"],
                            tmp_path / "configs", tmp_path / "with space" / "runs", ["a", "b"])
    assert command[:5] == ["py", str(tmp_path / "train.py"), "-m", "experiment=ablation_protocol",
                           "trainer.max_steps=5"]
    assert "hydra.sweep.subdir=${run_name}" in command and command[-1] == "+cell=a,b"
    assert f"hydra.sweep.dir='{tmp_path / 'with space' / 'runs'}'" in command  # quoted for Hydra's grammar
    assert f"hydra.searchpath=[file://{tmp_path / 'configs'}]" in command
    assert any(c.endswith("=scripts.ablate_callback.JobStatusFile") for c in command)


CHILD = textwrap.dedent("""
    import signal, sys, time
    got = []
    signal.signal(signal.SIGINT, lambda *a: got.append(1))
    print("ready", flush=True)
    deadline = time.time() + 20
    while not got and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a second copy of the signal would arrive now
    print(f"got {len(got)}", flush=True)
""")

PARENT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from analysis.launch import run_sweep
    sys.exit(run_sweep([sys.executable, "-c", {child!r}], cwd=Path.cwd()))
""")


@pytest.mark.parametrize("to_group", [True, False], ids=["terminal-ctrl-c", "kill-the-protocol"])
def test_ctrl_c_reaches_the_sweep_exactly_once(tmp_path, to_group):
    """A terminal's Ctrl-C goes to the whole foreground process group. The sweep runs in its own
    session, so it gets the SIGINT once, passed on by the protocol — twice would mean 'stop now,
    without a checkpoint' to train.py. Signalling the protocol process alone works the same."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(child=CHILD)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)  # a stand-in for the terminal's foreground group
    assert parent.stdout.readline().strip() == "ready"
    if to_group:
        os.killpg(parent.pid, signal.SIGINT)
    else:
        parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=30) == 128 + signal.SIGINT  # stopped on request
    assert parent.stdout.read().strip() == "got 1"  # the sweep saw the SIGINT exactly once


def test_a_signal_death_is_reported_as_128_plus_the_signal(tmp_path):
    assert run_sweep([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                     cwd=tmp_path) == 128 + signal.SIGTERM


def test_a_stop_request_wins_over_the_sweeps_own_exit_status(tmp_path):
    """A Ctrl-C that lands between two jobs makes Hydra exit 1 (KeyboardInterrupt), not 130: the
    protocol still reports it as stopped, so it prints how to continue instead of an error."""
    child = ("import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(1)); "
             "print('ready', flush=True); time.sleep(20)")
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(child=child)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline().strip() == "ready"
    parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=30) == 128 + signal.SIGINT
