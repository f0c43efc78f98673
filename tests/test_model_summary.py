"""scripts/model_summary.py: the LLaMA-7B width and its reasoning, the parameter table, one-line errors."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import model_summary as summary
from tests import forked
from training.program import exit_status

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "model_summary.py"
W256 = ("hidden_size=256", "n_heads=4")  # a width pinned for the arithmetic below, whatever the default is


def test_command_line_explains_the_llama_width():
    # One real subprocess: the script must run as `python scripts/model_summary.py` from anywhere.
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "hidden_size=4096", "n_heads=32", "model.multiple_of=256"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "10922.67" in out and "int(8d/3) = 10922" in out and "→ 11008" in out
    assert "intermediate_size=11008" in out
    for kind in ("embedding", "attention", "mlp", "norm", "lm_head", "total"):
        assert f"\n  {kind} " in out, kind
    # 3·d·I vs 8·d² per layer, for d=4096, I=11008
    assert f"{3 * 4096 * 11008:,}" in out and f"{8 * 4096**2:,}" in out and "ratio 1.008" in out


def test_default_config_summary(capsys):
    assert summary.main(["model=cpu"]) == 0
    out = capsys.readouterr().out
    # 4 layers × (attention 4·192² + MLP 3·192·512 + 2 norms of 192) + embedding 4096·192 (tied) + final norm
    total = 4 * (4 * 192**2 + 3 * 192 * 512 + 2 * 192) + 4096 * 192 + 192
    assert total == 2_557_632 and re.search(rf"\n  total +{total:,} ", out)
    assert "Parameters by module type (4 layers)" in out
    assert "512.00" in out and "int(8d/3) = 512" in out and "→ 512" in out


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs" / "model").glob("*.yaml")))
def test_every_model_yaml_loads(name):
    cfg, _ = summary.load_model_config([f"model={name}", "vocab_size=1000"])
    assert cfg.vocab_size == 1000 and cfg.resolved_intermediate_size % cfg.multiple_of == 0
    assert cfg.padded_vocab_size == 1024


def test_overrides_reach_the_config():
    cfg, _ = summary.load_model_config(["model=tiny", "hidden_size=96", "model.n_kv_heads=null", "mlp=gelu"])
    assert (cfg.hidden_size, cfg.resolved_n_kv_heads, cfg.resolved_intermediate_size) == (96, cfg.n_heads, 4 * 96)


@pytest.mark.parametrize("norm, per_layer", [("rmsnorm", 512), ("layernorm", 1024), ("none", 0)])
def test_per_layer_norm_parameters_are_honest(capsys, norm, per_layer):
    """The old table subtracted hidden_size for the final norm: -256 per layer with norm=none, wrong for layernorm."""
    assert summary.main(["model=cpu", *W256, f"norm={norm}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("norm "))
    assert row.split()[-1] == f"{per_layer:,}", row
    assert summary.main(["model=cpu", *W256, "norm=none", "qk_norm=true"]) == 0  # QK-norm: 2 · head_dim per layer
    row = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("norm "))
    layers = summary.load_model_config(["model=cpu"])[0].n_layers
    assert row.split()[1:] == [f"{layers * 2 * 64:,}", "0.0%", "128"], row


def test_padded_vocabulary_and_width_come_from_the_model(capsys, monkeypatch):
    calls = []
    real = summary.swiglu_intermediate_size
    monkeypatch.setattr(summary, "swiglu_intermediate_size", lambda *a: calls.append(a) or real(*a))
    assert summary.main(["model=cpu", *W256, "vocab_size=50257", "ffn_dim_multiplier=1.3"]) == 0
    out = capsys.readouterr().out
    assert "50,257 token ids → 50,304 embedding rows" in out and "47 padding rows" in out
    assert f"{50304 * 256:,}" in out  # the embedding has the padded row count
    assert (256, 32, 1.3) in calls  # the one home of the 8/3 rule, not a copy of it
    assert f"→ {real(256, 32, 1.3)} (" in out


@pytest.mark.parametrize(
    "args, expected",
    [
        (["hidden_size=250"], "model.hidden_size=250"),
        (["hiden_size=3"], "hiden_size"),
        (["hidden_size=big"], "model.hidden_size"),
        (["model=25M"], "model=25M is no option of the config group model; did you mean model=25m?"),
        (
            ["norm=batchnorm"],
            "model.norm='batchnorm' is unknown; choose one of ['rmsnorm', 'rmsnorm_bf16', 'layernorm', 'none']",
        ),
    ],
)
def test_bad_value_gives_a_one_line_error_and_status_1(capsys, args, expected):
    assert exit_status(summary.main, args) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]


def test_bad_value_exits_1_from_the_command_line():
    result = forked.run_script(SCRIPT, "hidden_size=256", "n_heads=7")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("error: model.hidden_size=256 is not divisible by model.n_heads=7")
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_parametrization_and_what_mup_scales_are_printed(capsys):
    assert summary.main(["model=cpu"]) == 0
    assert "\nParametrization: sp\n" in capsys.readouterr().out
    assert summary.main(["model=cpu", *W256, "parametrization=mup", "mup_base_width=64"]) == 0  # m = 4, head_dim 64
    out = capsys.readouterr().out
    assert "Parametrization: mup (m = 4 over base width 64)" in out
    assert "init std 0.02 × 1/sqrt(m) = 0.01;" in out
    assert "q·k × sqrt(base head_dim 16) / head_dim 64 = 0.0625" in out
    assert "the LM head's input × 1/m = 0.25;" in out
    assert "warning" not in out  # base head_dim 16: a whole number


def test_a_base_width_that_the_heads_do_not_divide_is_warned_about(capsys):
    """docs/mup.md's example once printed "base head_dim 21.3333" (base width 64, 3 heads) without a word."""
    assert summary.main(["model=cpu", "parametrization=mup", "mup_base_width=64"]) == 0
    out = capsys.readouterr().out
    assert "base head_dim 21.33" in out and "warning: the base width 64 is not a multiple of n_heads=3" in out
