"""μP through train.py: the keys compose (or fail naming the field), the header says which parametrization
trains, checkpoints carry it, and a stopped μP run resumes to the very bits of an uninterrupted one."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.train_helpers import read_metrics, run_dirs, run_train
from training.cli import ConfigError
from training.program import compose_train_config

pytestmark = pytest.mark.serial  # trains: one at a time under make test's two workers (tests/fixtures.py)

MUP = ["model.parametrization=mup", "model.mup_base_width=32"]  # debug=tiny: hidden 64, so m = 2


@pytest.fixture(scope="module")
def cache_dir(tiny_data_cache):
    return tiny_data_cache


def test_the_keys_compose_and_bad_values_fail_at_composition_naming_the_field():
    cfg, config_yaml = compose_train_config(["debug=tiny", *MUP])
    assert (cfg.model.parametrization, cfg.model.mup_base_width) == ("mup", 32)
    assert "parametrization: mup" in config_yaml and "mup_base_width: 32" in config_yaml
    assert compose_train_config(["debug=tiny"])[0].model.parametrization == "sp"
    for override, message in (
        ("model.parametrization=mu_p", "model.parametrization='mu_p' is unknown"),
        ("model.mup_base_width=0", "model.mup_base_width=0 must be a positive integer"),
    ):
        with pytest.raises((ConfigError, ValueError), match=message):
            compose_train_config(["debug=tiny", override])


@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_a_stopped_mup_run_resumes_bitwise_and_its_checkpoints_say_mup(tmp_path, cache_dir, optim):
    args = [
        *MUP,
        f"optim={optim}",
        "trainer.precision=fp32",
        "model.dropout=0.1",
        "trainer.log_interval=1",
        "trainer.max_steps=8",
        "trainer.ckpt_interval=4",
        "trainer.eval_interval=8",
    ]
    full = run_train(tmp_path / "full", *args, cache_dir=cache_dir)
    assert "2 layers, parametrization mup (m = 2 over base width 32)," in full.stdout
    run_train(tmp_path / "part", *args, "trainer.stop_at_step=4", cache_dir=cache_dir)
    (part,) = run_dirs(tmp_path / "part")
    run_train(tmp_path / "part", *args, f"resume={part}", cache_dir=cache_dir)
    (straight,) = run_dirs(tmp_path / "full")
    a, b = (load_file(run / "checkpoints" / "step_0000008" / "model.safetensors") for run in (straight, part))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = lambda run: {r["step"]: r["loss"] for r in read_metrics(run) if r["kind"] == "train"}  # noqa: E731
    assert losses(straight) == losses(part) and len(losses(part)) == 8
    saved = json.loads((part / "checkpoints" / "step_0000008" / "model_config.json").read_text())
    assert (saved["parametrization"], saved["mup_base_width"]) == ("mup", 32)
