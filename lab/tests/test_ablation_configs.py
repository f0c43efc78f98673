"""lab/ablation/configs.py: a cell's generated config (tests/test_launcher.py: how it runs)."""

import pytest

from lab.ablation.configs import cell_config
from lab.ablation.protocol import Cell

CELL = Cell("wide", "no_norm", 3e-3, 2)


def test_cell_config_sets_lr_schedule_seed_directory_and_wandb():
    values = {"model": {"norm": "none", "hidden_size": 128}}
    config = cell_config(CELL, values, 0.1, "ablate_x", "stage2")
    assert config["model"] == {"norm": "none", "hidden_size": 128} and values == {
        "model": {"norm": "none", "hidden_size": 128}
    }
    assert config["optim"] == {"lr": 3e-3, "min_lr": pytest.approx(3e-4)}
    assert (config["seed"], config["run_name"]) == (2, "wide/no_norm/lr0.003_seed2")
    assert config["logger"] == {
        "group": "ablate_x",
        "tags": ["ablate", "stage2", "variant=no_norm", "size=wide", "lr=0.003"],
    }
    assert "resume" not in config
