"""studies/ablation/configs.py: a cell's generated config and the multirun command."""
import pytest
import yaml

from studies.ablation.configs import cell_config, sweep_command, write_cells
from studies.ablation.protocol import Cell

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
    assert any(c.endswith("=cli.callbacks.JobStatusFile") for c in command)
