"""The coordinate check (lab/coord_check.py) on widths 32–256, 10 steps at lr 1e-2: under μP every
layer's activation RMS is flat in width, under SP the logits grow with it — for AdamW and for Muon.

Thresholds from measurement (seeds 0–3, docs/mup.md): under μP the fitted slopes of log RMS against log
width lay within [-0.17, +0.15] for every layer and both optimizers, so FLAT = 0.3 leaves room for other
machines' summation orders; under SP the logits' slope was +0.65…+0.67 (AdamW) and +0.52…+0.54 (Muon),
the blocks' outputs' +1.2 or more, so GROWS = 0.4. Muon at Adam's lr/m (μP scaled twice) measured an MLP
slope of -0.54…-0.64: this test fails on it.
"""

import pytest
import torch

from lab import coord_check as program
from lab.coord_check import ATTENTION_LOGITS, LAYERS, CoordSetup, coord_check, fitted_slope, plot_coord_check

FLAT, GROWS = 0.3, 0.4


@pytest.fixture(scope="module")
def results():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {
            (o, p): coord_check(CoordSetup(widths=(32, 64, 128, 256), base_width=32, optimizer=o, steps=10), p)
            for o in ("adamw", "muon")
            for p in ("sp", "mup")
        }
    finally:
        torch.set_num_threads(before)


def test_the_fitted_slope_is_the_exponent_of_a_power_law():
    assert fitted_slope([32, 64, 128], [3.0, 6.0, 12.0]) == pytest.approx(1.0)
    assert fitted_slope([32, 64, 128], [5.0, 5.0, 5.0]) == pytest.approx(0.0, abs=1e-12)
    assert fitted_slope([16, 64, 256], [4.0, 2.0, 1.0]) == pytest.approx(-0.5)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_under_mup_every_layer_is_flat_in_width(results, optimizer):
    result = results[(optimizer, "mup")]
    assert result.rms["logits"].shape == (11, 4)  # init and after each of the 10 steps, per width
    for moved in (False, True):  # the RMS itself, and how far it moved from init
        slopes = result.slopes(moved=moved)
        assert all(abs(slopes[layer]) < FLAT for layer in LAYERS), slopes


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_under_sp_the_logits_and_the_blocks_outputs_grow_with_width(results, optimizer):
    slopes = results[(optimizer, "sp")].slopes()
    assert slopes["logits"] > GROWS and min(slopes["attention"], slopes["mlp"]) > 2 * GROWS, slopes


def test_the_figure_has_a_panel_per_layer_and_run(results, tmp_path):
    plot_coord_check(list(results.values()), tmp_path / "coord.png")
    assert (tmp_path / "coord.png").stat().st_size > 10_000 and len(LAYERS) == 4


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_attention_logits_shrink_with_width_under_mup_at_init(results, optimizer):
    """q·k × scale at init: under SP (init std fixed, scale 1/sqrt(head_dim)) its RMS grows ∝ width; under μP
    the 1/sqrt(m) init of q and k and the 1/head_dim scale take width^-1.5 off that, so it shrinks ∝ width^-0.5
    — at width 512 the softmax starts near uniform. Recorded at every step beside the layers."""
    sp, mup = (results[(optimizer, p)].slopes(step=0)[ATTENTION_LOGITS] for p in ("sp", "mup"))
    assert sp == pytest.approx(1.0, abs=0.1) and mup == pytest.approx(-0.5, abs=0.1)
    assert results[(optimizer, "mup")].rms[ATTENTION_LOGITS].shape == (11, 4)


def test_as_trained_uses_the_transfer_runs_schedule_clipping_and_weight_decay(capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(program, "coord_check", lambda setup, p: seen.append(setup) or coord_check(setup, p))
    assert (
        program.main(
            ["--as-trained", "--widths", "32,64", "--steps", "3", "--optimizers", "adamw", "--out", "/dev/null"]
        )
        == 0
    )
    setup = seen[0]
    assert (setup.steps, setup.warmup_steps > 0, setup.min_lr, setup.weight_decay > 0, setup.grad_clip > 0) == (
        3,
        True,
        pytest.approx(1e-3),
        True,
        True,
    )
    assert ATTENTION_LOGITS in capsys.readouterr().out
