"""Every config group option and every experiment composes onto the typed schema and builds a model."""
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from model import Transformer
from train import register_configs
from training.config import TrainConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GROUPS = ["model", "data", "optim", "trainer", "logger", "debug", "experiment"]


def options(group: str) -> list:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def compose_typed(overrides: list) -> TrainConfig:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # so ${hydra:runtime.choices.*} resolves
        with open_dict(cfg):
            del cfg["hydra"]
        plain = OmegaConf.to_container(cfg, resolve=True)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), plain))


def test_every_group_has_options():
    for group in GROUPS:
        assert options(group), f"configs/{group}/ is empty"


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in options(g)])
def test_each_option_composes_and_builds(group, option):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "local":
        overrides.append("data.path=some/file.txt")
    cfg = compose_typed(overrides)
    assert isinstance(cfg, TrainConfig)
    with torch.device("meta"):  # shapes only: even the 125M config builds instantly
        model = Transformer(cfg.model)
    assert model.param_counts()["total"] > 0
    assert cfg.trainer.seq_len <= cfg.model.max_seq_len


def test_cli_overrides_reach_the_model():
    cfg = compose_typed(["model.hidden_size=4096", "model.multiple_of=256", "model.n_heads=32"])
    assert cfg.model.resolved_intermediate_size == 11008


def test_default_config_is_the_cpu_shakespeare_run():
    cfg = compose_typed([])
    assert cfg.data.source == "shakespeare" and cfg.model.hidden_size == 256
    assert cfg.trainer.precision == "auto" and cfg.logger.wandb == "auto"  # bf16 only where measured fast
    assert cfg.model.vocab_size == cfg.data.vocab_size


def test_typo_and_wrong_type_fail_at_composition():
    with pytest.raises(Exception, match="hiden_size"):
        compose_typed(["model.hiden_size=3"])
    with pytest.raises(Exception, match="hidden_size"):
        compose_typed(["model.hidden_size=big"])
