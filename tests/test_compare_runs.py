"""scripts/compare_runs.py on hand-written runs with known numbers: statistics, best cell, the
best-vs-runner-up verdict, paired Δ against the reference."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from matplotlib import image

import analysis.plots as plots
from analysis.stats import paired_t
from model import ModelConfig, Transformer
from scripts.compare_runs import main
from tests import forked
from tests.run_helpers import BPB_TO_LOSS, write_run, write_variant
from tests.train_helpers import REPO
from training.program import exit_status

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def compare(root: Path, capsys, *args) -> tuple:
    """(exit status, table rows as {variant: cells}, results.md text, stderr). The figures are drawn but written
    as a bare PNG signature, not rendered (~1 s a call): test_figures_are_valid_pngs renders them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "save", lambda fig, path: Path(path).write_bytes(PNG_MAGIC))
        status = exit_status(main, [str(root), *args])
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


def test_table_reports_mean_and_std_over_seeds(tmp_path, capsys):
    write_variant(tmp_path, [1.0, 1.3, 1.1], mlp="swiglu")
    write_variant(tmp_path, [2.0, 2.2], mlp="gelu", lr=1e-3)
    status, rows, _, _ = compare(tmp_path, capsys)
    assert status == 0
    best = rows["★ rmsnorm + swiglu, optim.lr=0.003, optim.min_lr=0.0003"]
    other = rows["rmsnorm + gelu, optim.lr=0.001, optim.min_lr=0.0001"]
    bpbs = [1.0, 1.3, 1.1]
    assert best[6] == f"**{np.mean(bpbs):.4f} ± {np.std(bpbs, ddof=1):.4f}**"
    losses = [BPB_TO_LOSS * b for b in bpbs]
    assert best[5] == f"{np.mean(losses):.4f} ± {np.std(losses, ddof=1):.4f}"
    assert best[9] == "3" and other[9] == "2"
    assert (best[4], other[4]) == ("0.003", "0.001")  # each variant's learning rate
    # tokens/s: per run the MEDIAN of its log intervals after the slow first (1010 + seed; the mean of all would be
    # 782.5 + seed), then the mean over seeds 0, 1, 2; wall time: the final elapsed_s.
    assert best[7] == "1,011" and best[8] == "40 s"


def test_every_row_is_marked_against_the_best_by_the_same_rule(tmp_path, capsys):
    """The old table marked two rows '(within noise)' by a rule of thumb and left a third, as far from a
    verdict, unmarked: now every row gets the paired test against ★, whatever its size."""
    write_variant(tmp_path, [1.00, 1.10, 1.20], mlp="swiglu")
    write_variant(tmp_path, [1.01, 1.13, 1.19], mlp="geglu")  # inside the noise
    write_variant(tmp_path, [2.00, 2.10, 2.21], mlp="gelu")  # far behind
    _, rows, text, _ = compare(tmp_path, capsys)
    near = paired_t([1.01, 1.13, 1.19], [1.00, 1.10, 1.20])
    assert rows["★ rmsnorm + swiglu"][10] == "—"
    assert rows["rmsnorm + geglu"][10] == f"{near.delta:+.4f} (can't tell, p = {near.p:.2f})"
    assert rows["rmsnorm + gelu"][10].startswith("+1.0033 (behind, p ")
    assert "within noise" not in text and "p = <" not in text


def test_best_is_the_lowest_bpb_and_marked_once(tmp_path, capsys):
    write_variant(tmp_path, [1.5, 1.6], norm="layernorm", mlp="gelu")
    write_variant(tmp_path, [1.2, 1.3], norm="rmsnorm", mlp="gelu")
    write_variant(tmp_path, [1.4, 1.5], norm="layernorm", mlp="swiglu")
    _, rows, text, _ = compare(tmp_path, capsys)
    assert list(rows) == ["★ rmsnorm + gelu", "layernorm + swiglu", "layernorm + gelu"]  # best first
    assert sum(line.startswith("| ★") for line in text.splitlines()) == 1  # one row marked
    assert "★ = lowest mean val bpb" in text and "| Δ bpb vs ★ (paired) |" in text  # the legend and the column


def test_verdict_compares_the_best_with_the_runner_up_not_the_last(tmp_path, capsys):
    """Three variants: the runner-up is inside seed noise of the best, the last far outside it.
    A verdict that looked at the last row would wrongly call the lead real."""
    write_variant(tmp_path, [1.00, 1.10, 1.20], mlp="swiglu")  # best
    write_variant(tmp_path, [1.01, 1.13, 1.19], mlp="geglu")  # runner-up: paired Δ +0.01 ± 0.05
    write_variant(tmp_path, [2.00, 2.10, 2.20], mlp="gelu")  # last: far behind
    _, rows, text, _ = compare(tmp_path, capsys)
    assert list(rows)[1] == "rmsnorm + geglu"
    assert "**Within seed noise:** rmsnorm + swiglu leads rmsnorm + geglu on the mean" in text
    assert "rmsnorm + swiglu: can't tell: Δ = +0.0" in text.split("Within seed noise")[1].splitlines()[0]


def test_verdict_calls_a_real_lead_with_the_paired_test(tmp_path, capsys):
    # Seed noise is large (0.2 between seeds) but every seed of the runner-up is 0.05 ± 0.005 worse:
    # an unpaired test cannot see it, the paired one does.
    write_variant(tmp_path, [1.00, 1.20, 1.40], mlp="swiglu")
    write_variant(tmp_path, [1.05, 1.255, 1.445], mlp="gelu")
    _, _, text, _ = compare(tmp_path, capsys)
    expected = paired_t([1.05, 1.255, 1.445], [1.00, 1.20, 1.40])
    assert expected.p < 0.05
    assert (
        "rmsnorm + swiglu is ahead of the runner-up rmsnorm + gelu (a post-hoc, unadjusted comparison of the "
        "table's two best, not a verdict): rmsnorm + gelu is worse: Δ = "
        f"{expected.delta:+.3f} ± {expected.half_width:.3f} bpb (95 % CI)"
    ) in text


def test_single_seed_says_std_unavailable_and_not_conclusive(tmp_path, capsys):
    write_variant(tmp_path, [1.0], mlp="swiglu")
    write_variant(tmp_path, [1.5], mlp="gelu")
    _, rows, text, _ = compare(tmp_path, capsys)
    assert rows["★ rmsnorm + swiglu"][6] == "**1.0000 ± n/a**"
    assert "**Not conclusive:**" in text and "1 paired seed" in text


def test_paired_delta_against_the_default_reference(tmp_path, capsys):
    write_variant(tmp_path, [1.20, 1.30, 1.40], mlp="swiglu")  # the reference, not the best
    write_variant(tmp_path, [1.10, 1.21, 1.29], mlp="gelu")
    write_variant(tmp_path, [1.25, 1.31, 1.46], norm="layernorm")
    _, _, text, _ = compare(tmp_path, capsys)
    paired = text.split("## Paired Δ against the reference")[1]
    gelu = next(line for line in paired.splitlines() if line.startswith("| rmsnorm + gelu"))
    t = paired_t([1.10, 1.21, 1.29], [1.20, 1.30, 1.40])
    assert gelu.split(" | ")[1:5] == ["3", f"{t.delta:+.4f}", f"[{t.low:+.4f}, {t.high:+.4f}]", f"{t.p:.2g}"]
    assert gelu.endswith("| **better** |")
    assert "- **layernorm + swiglu**: can't tell: Δ = " in paired
    assert "vs rmsnorm + swiglu" not in gelu  # one reference: named once, in the note
    assert "Δ = variant − rmsnorm + swiglu" in paired


def test_each_variant_is_compared_with_the_reference_of_its_own_size(tmp_path, capsys):
    for hidden, shift in ((32, 0.0), (64, -0.5)):
        write_variant(tmp_path, [1.2 + shift, 1.3 + shift], mlp="swiglu", hidden_size=hidden)
        write_variant(tmp_path, [1.1 + shift, 1.21 + shift], mlp="gelu", hidden_size=hidden)
    _, _, text, _ = compare(tmp_path, capsys)
    paired = [line for line in text.split("## Paired Δ")[1].splitlines() if line.startswith("| rmsnorm + gelu")]
    assert len(paired) == 2  # gelu at 32 vs swiglu at 32, gelu at 64 vs swiglu at 64 — never across sizes
    for line in paired:
        cells = line.split(" | ")
        assert cells[1] == cells[0].replace("| rmsnorm + gelu", "rmsnorm + swiglu")  # the reference column
        assert cells[3] == f"{paired_t([1.1, 1.21], [1.2, 1.3]).delta:+.4f}"


def test_qk_norm_is_compared_with_the_model_without_it(tmp_path, capsys):
    write_variant(tmp_path, [1.2, 1.3], extra_model={"qk_norm": False})
    write_variant(tmp_path, [1.1, 1.2], extra_model={"qk_norm": True})
    _, _, text, _ = compare(tmp_path, capsys)
    (line,) = [
        line for line in text.split("## Paired Δ")[1].splitlines() if "qk_norm=True" in line and line.startswith("| ")
    ]
    assert "| -0.1000 |" in line


def test_reference_can_be_chosen_and_a_wrong_one_is_an_error(tmp_path, capsys):
    write_variant(tmp_path, [1.2, 1.3], mlp="swiglu")
    write_variant(tmp_path, [1.1, 1.2], mlp="gelu")
    _, _, text, _ = compare(tmp_path, capsys, "--reference", "model.mlp=gelu")
    assert "- **rmsnorm + swiglu**: worse: Δ = +" in text
    status, _, _, err = compare(tmp_path, capsys, "--reference", "model.mlp=relu2")
    assert status == 1 and err.startswith("error: --reference model.mlp=relu2 matches none of the variants")
    status, _, _, err = compare(tmp_path, capsys, "--reference", "gelu")
    assert status == 1 and "is not key=value" in err


def test_no_reference_among_the_runs_is_a_note_not_an_error(tmp_path, capsys):
    write_variant(tmp_path, [1.2, 1.3], mlp="gelu")
    write_variant(tmp_path, [1.1, 1.2], mlp="relu2")
    status, _, text, _ = compare(tmp_path, capsys)
    assert status == 0 and "No reference variant (model.norm=rmsnorm model.mlp=swiglu" in text
    assert not (tmp_path / "comparison" / "forest.png").exists()


def test_parameter_columns_are_the_models_own_counts(tmp_path, capsys):
    write_variant(tmp_path, [1.0], mlp="swiglu")
    write_variant(tmp_path, [1.1], mlp="gelu")
    _, rows, _, _ = compare(tmp_path, capsys)
    for mlp, intermediate in (("swiglu", 96), ("gelu", 128)):  # 8/3·32 = 85 rounded up to 16s; 4·32
        cfg = ModelConfig(vocab_size=64, hidden_size=32, n_layers=2, n_heads=4, multiple_of=16, max_seq_len=32, mlp=mlp)
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
    for name in ("val_curves.png", "time_to_quality.png", "activation_rms.png", "forest.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        assert image.imread(out / name).shape[0] > 100


def test_no_rms_logged_means_no_rms_figure_and_a_warning(tmp_path, capsys):
    write_variant(tmp_path, [1.0], rms=False)
    status, _, _, err = compare(tmp_path, capsys)
    assert status == 0 and "no activation_rms.png" in err
    assert not (tmp_path / "comparison" / "activation_rms.png").exists()
    assert (tmp_path / "comparison" / "val_curves.png").exists()


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("empty", "no run directories"),
        ("all_incomplete", "none of the 1 runs"),
        ("config", "cannot read config.yaml"),
        ("metrics", "line 2 is not a JSON object"),
        ("model", "cannot build the model"),
    ],
)
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
    proc = forked.run_script(REPO / "scripts" / "compare_runs.py", tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith("error: no run directories")


def test_the_legend_sits_below_the_panels_for_many_variants(tmp_path, monkeypatch):
    """Six variants (an ablation's usual count): a legend inside a panel covered the curves it names."""
    from analysis.runs import group_variants, read_complete_runs

    for i, (norm, mlp) in enumerate(
        [
            ("rmsnorm", "swiglu"),
            ("layernorm", "swiglu"),
            ("rmsnorm", "gelu"),
            ("none", "swiglu"),
            ("rmsnorm", "geglu"),
            ("layernorm", "gelu"),
        ]
    ):
        write_variant(tmp_path, [1.0 + 0.05 * i, 1.1 + 0.05 * i], norm=norm, mlp=mlp)
    variants = group_variants(read_complete_runs([tmp_path])[0])
    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig))
    plots.plot_val_curves(variants, tmp_path / "v.png")
    plots.plot_activation_rms(variants, tmp_path / "a.png")
    for fig in figures:
        assert all(ax.get_legend() is None for ax in fig.axes)
        (legend,) = fig.legends
        assert len(legend.get_texts()) == 6 and legend._ncols == 3


def test_each_evaluation_is_placed_at_its_seconds_into_the_training_loop(tmp_path):
    """From the rows' wall-clock stamps: the loop's start is the first train row's stamp less its elapsed_s, and
    an evaluation sits where its row was written (here 10 s a step, the eval row 2 s after its step's)."""
    from analysis.runs import read_run

    run = read_run(write_run(tmp_path, "timed", bpb=1.0, max_steps=4))
    assert run.eval_seconds() == [(22.0, 2.0), (42.0, 1.0)]
    for row in run.trains:
        del row["time"]
    assert run.eval_seconds() == []  # rows from before the stamps: no time axis rather than a wrong one


@pytest.mark.parametrize(
    "state, complete",
    [
        ({"step": 4, "max_steps": 4}, True),  # a budget or max_epochs ended it
        ({"step": 4, "max_steps": 6}, False),  # stopped before its planned end
        ({"step": 4, "max_steps": 6, "stopped_early": True}, True),
    ],
)
def test_a_run_is_complete_at_the_end_its_checkpoint_planned_not_at_trainer_max_steps(tmp_path, state, complete):
    """A time budget or trainer.max_epochs decides a run's length, and early stopping can end it: its config's
    trainer.max_steps (1000 here) is then only the schedule's ceiling. The newest checkpoint's state.json says."""
    from analysis.runs import read_run

    path = write_run(tmp_path, "planned", bpb=1.0, max_steps=1000, last_step=4)
    assert not read_run(path).complete  # no checkpoint: trainer.max_steps
    ckpt = path / "checkpoints" / "step_0000004"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps(state))
    assert read_run(path).complete is complete


def test_the_setup_line_gives_the_steps_each_run_planned_when_a_time_budget_left_max_steps_null(tmp_path, capsys):
    """The default run's config has trainer.max_steps: null (its time budget plans the end, in state.json): the setup
    line gives the planned ends, a range when the seeds' budgets planned differently — never 'None steps'."""
    for seed, end in ((0, 4), (1, 6)):
        path = write_run(tmp_path, f"budget_seed{seed}", seed=seed, bpb=1.0 + seed / 100, max_steps=end)
        config = yaml.safe_load((path / "config.yaml").read_text())
        config["trainer"].update(max_steps=None, time_budget=10.0)
        (path / "config.yaml").write_text(yaml.safe_dump(config))
        ckpt = path / "checkpoints" / f"step_{end:07d}"
        ckpt.mkdir(parents=True)
        (ckpt / "state.json").write_text(json.dumps({"step": end, "max_steps": end}))
    status, _, text, _ = compare(tmp_path, capsys)
    assert status == 0 and "(vocab 64), 4–6 steps, " in text and "None steps" not in text


@pytest.mark.parametrize("key, other, warned", [("source", "local", True), ("vocab_size", 128, False)])
def test_variants_scored_on_other_validation_text_are_flagged_but_another_tokenizer_is_not(
    tmp_path, capsys, key, other, warned
):
    """Bits per byte on other text compare the data as much as the models; another vocabulary on the same text is a
    fair comparison (bpb is per byte), as is any key that does not choose the validation text."""
    for seed in range(2):
        write_run(tmp_path, f"a_seed{seed}", seed=seed, bpb=1.0 + seed / 100)
        path = write_run(tmp_path, f"b_seed{seed}", seed=seed, bpb=1.1 + seed / 100)
        config = yaml.safe_load((path / "config.yaml").read_text())
        config["data"][key] = other
        (path / "config.yaml").write_text(yaml.safe_dump(config))
    status, rows, text, _ = compare(tmp_path, capsys)
    flagged = f"⚠ The variants were scored on different validation text (data.{key} differ)" in text
    assert status == 0 and len(rows) == 2 and flagged is warned


def test_a_budget_run_whose_checkpoints_were_deleted_is_skipped_with_a_warning_not_a_traceback(tmp_path, capsys):
    """Only state.json knows where a time budget ended a run (trainer.max_steps is null): without a checkpoint left,
    the run cannot be shown complete, and it is skipped saying why."""
    for name, keep_checkpoint in (("kept", True), ("pruned", False)):
        path = write_run(tmp_path, name, bpb=1.0, max_steps=4)
        config = yaml.safe_load((path / "config.yaml").read_text())
        config["trainer"]["max_steps"] = None
        (path / "config.yaml").write_text(yaml.safe_dump(config))
        if keep_checkpoint:
            (path / "checkpoints" / "step_0000004").mkdir(parents=True)
            (path / "checkpoints" / "step_0000004" / "state.json").write_text(json.dumps({"step": 4, "max_steps": 4}))
    status, rows, _, err = compare(tmp_path, capsys)
    assert status == 0 and len(rows) == 1
    assert "skipping" in err and "pruned: incomplete (last eval at step 4 of an end only its deleted checkpoints" in err
