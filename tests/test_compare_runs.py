"""scripts/compare_runs.py on hand-written runs with known numbers: statistics, best cell, noise verdict."""
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from matplotlib import image

from analysis.stats import noise_of_difference, summarize, within_noise
from model import ModelConfig, Transformer
from scripts.compare_runs import main
from tests.train_helpers import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BPB_TO_LOSS = 1.7  # any fixed ratio: one tokenizer, so loss and bpb rank alike


def write_run(root: Path, name: str, *, norm="rmsnorm", mlp="swiglu", seed=0, bpb=1.0, max_steps=4, last_step=None,
              rms=True, hidden_size=32, cache_dir="cache") -> Path:
    """A run directory as train.py leaves it: config.yaml and metrics.jsonl (evals at steps 2 and 4)."""
    run = root / name
    run.mkdir(parents=True)
    config = {"model": {"vocab_size": 64, "hidden_size": hidden_size, "n_layers": 2, "n_heads": 4, "n_kv_heads": None,
                        "multiple_of": 16, "intermediate_size": None, "max_seq_len": 32, "norm": norm, "mlp": mlp},
              "data": {"source": "shakespeare", "vocab_size": 64, "cache_dir": cache_dir},
              "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 1},
              "trainer": {"max_steps": max_steps, "precision": "bf16", "device": "cpu"},
              "logger": {"wandb": "disabled", "tags": [f"norm={norm}"]}, "seed": seed, "run_name": name}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for step in range(1, (last_step or max_steps) + 1):
        rows.append({"kind": "train", "step": step, "loss": 3.0, "tokens": 100 * step, "elapsed_s": 10.0 * step,
                     "tokens_per_s": 1000.0 + seed})
        if step % 2 == 0:
            final_bpb = bpb + (max_steps - step) * 0.5  # decreasing towards the given final value
            row = {"kind": "eval", "step": step, "tokens": 100 * step, "val_loss": BPB_TO_LOSS * final_bpb,
                   "val_bpb": final_bpb}
            if rms:
                row["rms_residual"] = [1.0 + seed, 2.0 * step]
            rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def write_variant(root: Path, bpbs, **kwargs) -> None:
    label = f"{kwargs.get('norm', 'rmsnorm')}_{kwargs.get('mlp', 'swiglu')}"
    for seed, bpb in enumerate(bpbs):
        write_run(root, f"{label}_seed{seed}", seed=seed, bpb=bpb, **kwargs)


def compare(root: Path, capsys) -> tuple:
    """(exit status, table rows as {variant: cells}, results.md text, stderr)."""
    status = main([str(root)])
    err = capsys.readouterr().err
    if status != 0:
        return status, {}, "", err
    text = (root / "comparison" / "results.md").read_text()
    rows = {}
    for line in text.splitlines()[2:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("| ").split(" | ")]
        rows[cells[0]] = cells
    return status, rows, text, err


def test_summarize_is_mean_and_sample_std():
    values = [1.0, 1.3, 1.1, 0.95]
    s = summarize(values)
    assert s.mean == pytest.approx(np.mean(values)) and s.n == 4
    assert s.std == pytest.approx(np.std(values, ddof=1)) == pytest.approx(statistics.stdev(values))
    assert s.std > np.std(values)  # the sample (ddof=1) std, not the population one
    assert math.isnan(summarize([2.0]).std)
    with pytest.raises(ValueError):
        summarize([])


def test_within_noise_flips_at_twice_the_standard_error():
    a, b = summarize([1.0, 1.2]), summarize([1.0, 1.2])  # std 0.1414 each → se of difference 0.1414
    se = noise_of_difference(a, b)
    assert se == pytest.approx(math.sqrt(2 * 0.02 / 2))
    shifted = lambda d: summarize([1.0 + d, 1.2 + d])
    assert within_noise(a, shifted(1.99 * se)) is True
    assert within_noise(a, shifted(2.01 * se)) is False
    assert within_noise(summarize([1.0]), b) is None  # one seed: no noise estimate, no verdict


def test_table_reports_mean_and_std_over_seeds(tmp_path, capsys):
    write_variant(tmp_path, [1.0, 1.3, 1.1], mlp="swiglu")
    write_variant(tmp_path, [2.0, 2.2], mlp="gelu")
    status, rows, _, _ = compare(tmp_path, capsys)
    assert status == 0
    best, other = rows["★ rmsnorm + swiglu"], rows["rmsnorm + gelu"]
    bpbs = [1.0, 1.3, 1.1]
    assert best[5] == f"**{np.mean(bpbs):.4f} ± {np.std(bpbs, ddof=1):.4f}**"
    losses = [BPB_TO_LOSS * b for b in bpbs]
    assert best[4] == f"{np.mean(losses):.4f} ± {np.std(losses, ddof=1):.4f}"
    assert best[9] == "3" and other[9] == "2"
    assert best[7] == "1,001" and best[8] == "40 s"  # mean over seeds of median tokens/s; final elapsed_s
    assert other[6] == f"+{2.1 - np.mean(bpbs):.4f}"


def test_best_is_the_lowest_bpb_and_marked_once(tmp_path, capsys):
    write_variant(tmp_path, [1.5, 1.6], norm="layernorm", mlp="gelu")
    write_variant(tmp_path, [1.2, 1.3], norm="rmsnorm", mlp="gelu")
    write_variant(tmp_path, [1.4, 1.5], norm="layernorm", mlp="swiglu")
    _, rows, text, _ = compare(tmp_path, capsys)
    assert list(rows) == ["★ rmsnorm + gelu", "layernorm + swiglu", "layernorm + gelu"]  # best first
    assert text.count("★") == 2  # the marked row and the legend line that explains it


def test_noise_note_when_inside_and_outside_seed_noise(tmp_path, capsys):
    close, far = tmp_path / "close", tmp_path / "far"
    write_variant(close, [1.00, 1.10], mlp="swiglu")
    write_variant(close, [1.02, 1.12], mlp="gelu")
    write_variant(far, [1.00, 1.01], mlp="swiglu")
    write_variant(far, [1.50, 1.51], mlp="gelu")
    _, rows, text, _ = compare(close, capsys)
    assert "Within seed noise" in text and rows["rmsnorm + gelu"][6].endswith("(within noise)")
    _, rows, text, _ = compare(far, capsys)
    assert "outside seed noise" in text and "Within seed noise" not in text
    assert "within noise" not in rows["rmsnorm + gelu"][6]


def test_single_seed_says_std_unavailable_and_not_conclusive(tmp_path, capsys):
    write_variant(tmp_path, [1.0], mlp="swiglu")
    write_variant(tmp_path, [1.5], mlp="gelu")
    _, rows, text, _ = compare(tmp_path, capsys)
    assert rows["★ rmsnorm + swiglu"][5] == "**1.0000 ± n/a**"
    assert "Not conclusive" in text


def test_parameter_columns_are_the_models_own_counts(tmp_path, capsys):
    write_variant(tmp_path, [1.0], mlp="swiglu")
    write_variant(tmp_path, [1.1], mlp="gelu")
    _, rows, _, _ = compare(tmp_path, capsys)
    for mlp, intermediate in (("swiglu", 96), ("gelu", 128)):  # 8/3·32 = 85 rounded up to 16s; 4·32
        cfg = ModelConfig(vocab_size=64, hidden_size=32, n_layers=2, n_heads=4, multiple_of=16, max_seq_len=32,
                          mlp=mlp)
        counts = Transformer(cfg).param_counts()  # real weights, not the script's meta-device build
        row = next(r for label, r in rows.items() if label.endswith(mlp))
        assert row[1:4] == [f"{counts['total']:,}", f"{counts['mlp']:,}", str(intermediate)]


def test_variants_ignore_seed_and_paths_but_not_other_keys(tmp_path, capsys):
    write_run(tmp_path, "a", seed=0, cache_dir="/x")
    write_run(tmp_path, "b", seed=1, cache_dir="/y")
    write_run(tmp_path, "wide", seed=0, hidden_size=64)
    _, rows, _, _ = compare(tmp_path, capsys)
    assert set(rows) == {"★ rmsnorm + swiglu, model.hidden_size=32", "rmsnorm + swiglu, model.hidden_size=64"}
    assert rows["★ rmsnorm + swiglu, model.hidden_size=32"][9] == "2"


def test_incomplete_runs_are_skipped_with_a_warning(tmp_path, capsys):
    write_variant(tmp_path, [1.0, 1.1])
    write_run(tmp_path, "diverged", mlp="gelu", last_step=2)
    status, rows, text, err = compare(tmp_path, capsys)
    assert status == 0 and list(rows) == ["★ rmsnorm + swiglu"]
    assert "skipping" in err and "diverged" in err and "`diverged`" in text


def test_figures_are_valid_pngs(tmp_path, capsys):
    write_variant(tmp_path, [1.0, 1.1], mlp="swiglu")
    write_variant(tmp_path, [1.2, 1.3], mlp="gelu")
    out = tmp_path / "elsewhere"
    assert main([str(tmp_path), "--out", str(out)]) == 0
    assert "| ★ rmsnorm + swiglu" in capsys.readouterr().out  # the table is printed too
    for name in ("val_curves.png", "activation_rms.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        assert image.imread(out / name).shape[0] > 100


def test_no_rms_logged_means_no_rms_figure_and_a_warning(tmp_path, capsys):
    write_variant(tmp_path, [1.0], rms=False)
    status, _, _, err = compare(tmp_path, capsys)
    assert status == 0 and "no activation_rms.png" in err
    assert not (tmp_path / "comparison" / "activation_rms.png").exists()
    assert (tmp_path / "comparison" / "val_curves.png").exists()


@pytest.mark.parametrize("breakage, message", [
    ("empty", "no run directories"),
    ("all_incomplete", "none of the 1 runs"),
    ("config", "cannot read config.yaml"),
    ("metrics", "line 2 is not JSON"),
    ("model", "cannot build the model"),
])
def test_bad_input_is_a_one_line_error(tmp_path, capsys, breakage, message):
    if breakage == "all_incomplete":
        write_run(tmp_path, "r", last_step=2)
    elif breakage != "empty":
        run = write_run(tmp_path, "r")
        if breakage == "config":
            (run / "config.yaml").write_text("model: [unclosed")
        elif breakage == "metrics":
            with open(run / "metrics.jsonl", "a") as f:
                f.write("{not json\n")
            lines = (run / "metrics.jsonl").read_text().splitlines()
            (run / "metrics.jsonl").write_text("\n".join([lines[0], lines[-1]] + lines[1:-1]) + "\n")
        else:
            (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("n_heads: 4", "n_heads: 3"))
    status, _, _, err = compare(tmp_path, capsys)
    assert status == 1
    (line,) = [line for line in err.splitlines() if not line.startswith("warning: ")]  # the skipped run warns
    assert line.startswith("error: ") and message in line


def test_command_line_exit_status(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith("error: no run directories")
