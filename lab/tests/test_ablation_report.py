"""lab/ablation/report.py on a hand-written two-size protocol with known numbers: an LR extension and a
variant diverging everywhere, the four verdicts, Holm within each family at both LR choices, the literature
paragraph, the power, the data files beside the report — and a protocol only half done."""

import csv
import json
import math

import pytest
import yaml
from matplotlib import image
from scipy import stats

from lab.ablation import protocol as C
from lab.ablation import report as protocol_report
from lab.ablation.protocol import Spec, stage2_cells
from tests.run_helpers import write_run
from training.checkpoint import JOB_STATUS

SPEC = Spec(
    variants={"ref": [], "gelu": ["model.mlp=gelu"], "ln": ["model.norm=layernorm"], "none": ["model.norm=none"]},
    reference="ref",
    lr_grid=[1e-3, 2e-3, 4e-3],
    seeds=[0, 1, 2, 3, 4],
    stage1_seed=100,
    lr_extensions=1,
    sizes={"small": [], "deep": ["model.n_layers=4"]},
    primary=["ln", "gelu"],
    secondary=["none"],
    planning_sd=0.02,
    equivalence_margin=0.01,
)
REGISTERED = f"Pre-registered 2026-12-01 00:00:00 +0000, SHA-256 {'0' * 64}."  # registration.check's line
MODEL = {"ref": {}, "gelu": {"mlp": "gelu"}, "ln": {"norm": "layernorm"}, "none": {"norm": "none"}}
U = {1e-3: 2.5, 2e-3: 2.4, 4e-3: 2.45}  # a bowl with its bottom at 2e-3
SWEEPS = {
    ("small", "gelu"): {1e-3: 2.6, 2e-3: 2.5, 4e-3: 2.45, 8e-3: 2.55},  # best at the edge, then interior
    ("small", "none"): {1e-3: None, 2e-3: None, 4e-3: None, 5e-4: None},  # diverged, extension included
    ("deep", "none"): {1e-3: 2.6, 2e-3: 2.7, 4e-3: 2.8, 5e-4: 2.65},
}
CHOSEN = {
    "small": {"ref": 2e-3, "gelu": 4e-3, "ln": 2e-3, "none": None},
    "deep": {"ref": 2e-3, "gelu": 2e-3, "ln": 2e-3, "none": 1e-3},
}
REFERENCE = {"small": [2.00, 2.10, 1.90, 2.05, 1.95], "deep": [1.80, 1.85, 1.75, 1.90, 1.70]}
CLEAR = [0.05, 0.06, 0.04, 0.055, 0.045]
DIFFS = {
    ("small", "gelu", 4e-3): CLEAR,  # worse at its own LR: agrees with the literature
    ("small", "gelu", 2e-3): [0.03, -0.02, 0.04, -0.01, 0.0],  # at the shared LR: can't tell
    ("small", "ln", 2e-3): [0.001, -0.001, 0.0005, -0.0005, 0.0],  # equivalent within ±0.01
    ("deep", "gelu", 2e-3): [-d for d in CLEAR],  # better: disagrees
    ("deep", "ln", 2e-3): [0.03, -0.03, 0.02, -0.025, 0.004],  # can't tell
    ("deep", "none", 1e-3): [0.3, 0.32, 0.28, 0.31, 0.29],
    ("deep", "none", 2e-3): [0.4, 0.42, 0.38, 0.41, 0.39],
}


def bpb(size, variant, lr, seed):
    return REFERENCE[size][seed] + (0.0 if variant == "ref" else DIFFS[size, variant, lr][seed])


def diverged(runs, cell):
    path = runs / cell.run_name
    path.mkdir(parents=True)
    (path / JOB_STATUS).write_text(
        yaml.safe_dump({"status": "FAILED", "error": "non-finite loss", "error_types": ["NonFiniteLoss"]})
    )


def write_protocol(runs, finished_seeds=(0, 1, 2, 3, 4)):
    for size in SPEC.sizes:
        for variant in SPEC.variants:
            for lr, value in SWEEPS.get((size, variant), U).items():
                cell = C.Cell(size, variant, lr, SPEC.stage1_seed)
                if value is None:
                    diverged(runs, cell)
                else:
                    write_run(runs, cell.run_name, seed=100, bpb=value, lr=lr, **MODEL[variant])
    for cell in stage2_cells(SPEC, CHOSEN):
        if cell.seed not in finished_seeds:
            continue
        if (cell.size, cell.variant) == ("small", "none"):  # diverges at the shared LR too
            diverged(runs, cell)
        else:
            write_run(
                runs,
                cell.run_name,
                seed=cell.seed,
                bpb=bpb(cell.size, cell.variant, cell.lr, cell.seed),
                lr=cell.lr,
                extra_model={"n_layers": 4} if cell.size == "deep" else None,
                **MODEL[cell.variant],
            )


def report(tmp_path, **kwargs):
    runs = tmp_path / "runs"
    write_protocol(runs, **kwargs)
    states = C.stage1_states(SPEC, lambda cells: {c: C.inspect(c, runs) for c in cells})
    chosen = C.chosen_lrs(SPEC, states)
    states.update({c: C.inspect(c, runs) for c in stage2_cells(SPEC, chosen)})
    return chosen, protocol_report.write(SPEC, states, chosen, tmp_path / "report", "test protocol", REGISTERED), states


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The whole protocol's report, written once: (report dir, chosen, text, states)."""
    root = tmp_path_factory.mktemp("protocol")
    chosen, text, states = report(root)
    return root / "report", chosen, text, states


def holm_by_hand(pvalues):
    """Holm's step-down: sort, multiply the k-th smallest by (m − k + 1), carry the running maximum, cap at 1."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def section(text, start, end=None):
    body = text.split(start, 1)[1]
    return body.split(end, 1)[0] if end else body


def test_lr_sweeps_extend_past_the_edge_and_the_choice_follows(finished):
    _, chosen, text, _ = finished
    assert chosen == CHOSEN
    small = section(text, "**small** (final val bpb", "**deep**")
    assert "| variant | lr 0.0005 | lr 0.001 | lr 0.002 | lr 0.004 | lr 0.008 | chosen |" in small
    assert (
        "| gelu | — | 2.6000 | 2.5000 | **2.4500** | 2.5500† | 0.004 (interior after 1 extension(s); margin +0.050 bpb over the runner-up) |"
        in small
    )
    assert "| none | diverged† | diverged | diverged | diverged | — | diverged at every LR, down to 0.0005 |" in small
    assert (
        "| ref | — | 2.5000 | **2.4000** | 2.4500 | — | 0.002 (interior; margin +0.050 bpb over the runner-up) |"
        in small
    )


def test_primary_verdicts_at_both_lr_choices_are_holm_adjusted_within_their_family(finished):
    out, _, text, _ = finished
    rows = {(r["lr_choice"], r["size"], r["variant"]): r for r in csv.DictReader(open(out / "contrasts.csv"))}
    for choice in ("own", "shared"):
        family = [(choice, size, v) for size in SPEC.sizes for v in SPEC.primary]
        raw = [
            stats.ttest_rel([bpb(s, v, float(rows[choice, s, v]["lr"]), i) for i in range(5)], REFERENCE[s]).pvalue
            for _, s, v in family
        ]
        for key, p, adjusted in zip(family, raw, holm_by_hand(raw)):
            assert float(rows[key]["p"]) == pytest.approx(p, rel=1e-6)
            assert float(rows[key]["p_adjusted"]) == pytest.approx(adjusted, rel=1e-6)
    outcomes = {key: r["verdict"] for key, r in rows.items()}
    assert outcomes[("own", "small", "gelu")] == "worse" and outcomes[("own", "deep", "gelu")] == "better"
    assert outcomes[("own", "small", "ln")] == "equivalent" and outcomes[("own", "deep", "ln")] == "can't tell"
    assert outcomes[("shared", "small", "gelu")] == "can't tell"  # the same variant at the reference's LR
    assert outcomes[("own", "small", "none")] == "can't tell" and outcomes[("own", "deep", "none")] == "worse"
    secondary = section(text, "### Every variant at the reference's best LR", "## Does it hold")
    assert "| none vs ref | small | 0.002 / 0.002 | 0 | n/a |" in secondary
    assert (
        "- **none** at small: can't tell: fewer than 2 paired seeds, no test (5 run(s) diverged at lr 0.002)"
        in secondary
    )
    assert "- **none** at small: can't tell: no test — diverged at every LR tried" in text
    verdicts = section(text, "## Verdicts on the primary contrasts", "### Against the literature")
    assert "- **gelu vs ref** at small: worse: Δ = +0.0500 ± 0.0098 bpb (95 % CI), Holm p" in verdicts
    assert "(primary, own LR family of 4)" in verdicts and "(primary, shared LR family of 4)" in verdicts
    assert "- **ln vs ref** at small: equivalent within ±0.01 bpb: TOST ±0.01 bpb: Holm p" in verdicts
    assert "Each variant at its own best LR:" in verdicts and "Every variant at the reference's best LR:" in verdicts
    assert "p = <" not in text


def test_the_literature_paragraph_is_filled_in_from_the_verdicts(finished):
    _, _, text, _ = finished
    literature = section(text, "### Against the literature", "## Power")
    ln, gelu = literature.strip().split("\n\n")  # in the order of the spec's primaries
    assert gelu.startswith("**SwiGLU vs GELU at matched parameters** (`gelu`). The literature: SwiGLU beat")
    assert "Shazeer 2020" in gelu and "Narang et al. 2021" in gelu
    assert "This study **is mixed" in gelu and "small: worse (agrees); deep: better (disagrees)" in gelu
    assert "Why it may not agree at this scale:" in gelu
    assert ln.startswith("**RMSNorm vs LayerNorm** (`ln`)") and "Zhang & Sennrich 2019" in ln
    assert "This study **partly agrees (can't tell elsewhere)**" in ln and "small: equivalent (agrees)" in ln


def test_power_is_stated_from_the_plan_and_from_the_measured_spread(finished):
    from lab import stats as power

    _, _, text, _ = finished
    lines = section(text, "## Power", "## Stage 1")
    planned = power.mde(0.02, 5, 0.05 / 4)
    assert f"- primary (m = 4, α/m = 0.0125): planned {planned:.4f} bpb (sd 0.0200, the spec's planning_sd)" in lines
    diffs = {
        k: v
        for k, v in DIFFS.items()
        if k in {("small", "gelu", 4e-3), ("small", "ln", 2e-3), ("deep", "gelu", 2e-3), ("deep", "ln", 2e-3)}
    }
    assert f"pooled sd {power.pooled_sd(diffs):.4f} over 16 dof" in lines


def test_every_number_is_in_the_data_files_beside_the_report(finished):
    out, _, text, states = finished
    cells = list(csv.DictReader(open(out / "per_seed.csv")))
    assert len(cells) == len(states)
    row = next(r for r in cells if (r["size"], r["variant"], r["seed"], r["lr"]) == ("small", "gelu", "3", "0.004"))
    assert (row["stage"], row["state"]) == ("stage2", "finished")
    assert float(row["val_bpb"]) == pytest.approx(REFERENCE["small"][3] + CLEAR[3])
    assert {r["state"] for r in cells if (r["size"], r["variant"]) == ("small", "none")} == {"diverged"}
    gelu = next(
        r
        for r in csv.DictReader(open(out / "contrasts.csv"))
        if (r["lr_choice"], r["size"], r["variant"]) == ("own", "small", "gelu")
    )
    assert gelu["per_seed_delta"] == "0:+0.050000;1:+0.060000;2:+0.040000;3:+0.055000;4:+0.045000"
    data = json.loads((out / "results.json").read_text())
    assert (
        data["chosen_lr"] == CHOSEN
        and len(data["contrasts"]) == 2 * 2 * 3
        and data["spec"]["primary"] == ["ln", "gelu"]
    )
    assert "[per_seed.csv](per_seed.csv)" in text and (out / "results.md").read_text() == text
    assert {r["precision"] for r in cells if r["state"] == "finished"} == {"bf16"}
    finished_runs = sum(s.run is not None for s in states.values())
    assert f"Precision (from the cells' metrics): bf16 in {finished_runs}.\n" in text and "⚠" not in text


def test_cells_that_trained_in_different_precisions_are_flagged(tmp_path):
    """A protocol resumed on another CPU class under trainer.precision=auto can mix bf16 and fp32 cells."""
    kinds = {0: "bf16", 1: "bf16", 2: "fp32", 3: "bf16+fp32", 4: None}
    states = {}
    for seed, precision in kinds.items():
        cell = C.Cell("small", "ref", 2e-3, seed)
        write_run(tmp_path, cell.run_name, seed=seed, precision=precision)
        states[cell] = C.inspect(cell, tmp_path)
    text = protocol_report._precisions(states)
    assert text.startswith(
        "Precision (from the cells' metrics): bf16 in 2, fp32 in 1, bf16+fp32 in 1, not recorded "
        "in 1. ⚠ The cells did not all train in one precision"
    )
    rows = {r["seed"]: r["precision"] for r in protocol_report.cell_rows(SPEC, states)}
    assert rows == {0: "bf16", 1: "bf16", 2: "fp32", 3: "bf16+fp32", 4: ""}


def test_depth_check_and_figures(finished):
    out, _, text, _ = finished
    depth = section(text, "## Does it hold across sizes?")
    assert "**flips**" in next(line for line in depth.splitlines() if line.startswith("| gelu"))
    none = next(line for line in depth.splitlines() if line.startswith("| none"))
    assert none.startswith("| none | — |") and "(worse)" in none
    for name in ("lr_sweep", "forest", "delta_vs_size", "val_curves_small", "val_curves_deep", "activation_rms_small"):
        assert image.imread(out / f"{name}.png").ndim == 3, name


def test_report_of_a_half_done_protocol_says_what_is_missing(tmp_path):
    _, text, _ = report(tmp_path, finished_seeds=(0,))
    table = section(text, "### Each variant at its own best LR", "### Every variant")
    assert "| gelu vs ref | small | 0.004 / 0.002 | 1 | n/a | n/a | n/a | n/a | n/a | **can't tell** |" in table
    assert "- **gelu** at small: can't tell: fewer than 2 paired seeds, no test" in table
    assert "Cells: " in text and " missing" in text
    assert "Stage 2 (measurement) on seeds 0, 1, 2, 3, 4" in text and "seed 100, never a measuring seed" in text
    assert math.isfinite(float(next(csv.DictReader(open(tmp_path / "report" / "per_seed.csv")))["lr"]))
