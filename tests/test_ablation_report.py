"""analysis/ablation/report.py on a hand-written two-size protocol with known numbers: the LR table,
each size's paired Δ, the scale check, the figures — and a protocol only half done."""
import yaml
from matplotlib import image

from analysis.ablation import cells as C
from analysis.ablation import report as protocol_report
from analysis.ablation.protocol import Spec, stage1_cells, stage2_cells
from tests.run_helpers import write_run

SPEC = Spec(variants={"ref": [], "gelu": ["model.mlp=gelu"], "ln": ["model.norm=layernorm"]}, reference="ref",
            lr_grid=[1e-3, 1e-2], seeds=[0, 1, 2], sizes={"small": [], "wide": ["model.hidden_size=64"]})
HIDDEN = {"small": 32, "wide": 64}
MODEL = {"ref": {}, "gelu": {"mlp": "gelu"}, "ln": {"norm": "layernorm"}}
CHOSEN = {"small": {"ref": 1e-2, "gelu": 1e-3, "ln": None}, "wide": {"ref": 1e-2, "gelu": 1e-2, "ln": None}}
# Final val bpb per (size, variant) and seed: gelu is better at small, worse at wide (it flips).
BPB = {("small", "ref"): [2.00, 2.10, 2.20], ("small", "gelu"): [1.90, 2.01, 2.09],
       ("wide", "ref"): [1.80, 1.90, 2.00], ("wide", "gelu"): [1.90, 2.01, 2.09]}


def write_protocol(runs, finished_seeds=(0, 1, 2)):
    for cell in stage1_cells(SPEC):
        if cell.variant == "ln":  # diverged at every LR
            path = runs / cell.run_name
            path.mkdir(parents=True)
            (path / C.STATUS_FILE).write_text(yaml.safe_dump({"status": "FAILED", "error": "non-finite loss",
                                                              "error_types": ["NonFiniteLoss"]}))
        elif cell.lr != CHOSEN[cell.size][cell.variant]:
            write_run(runs, cell.run_name, bpb=2.5, lr=cell.lr, hidden_size=HIDDEN[cell.size], **MODEL[cell.variant])
    for cell in stage2_cells(SPEC, CHOSEN):
        if cell.seed in finished_seeds:
            write_run(runs, cell.run_name, seed=cell.seed, bpb=BPB[cell.size, cell.variant][cell.seed], lr=cell.lr,
                      hidden_size=HIDDEN[cell.size], **MODEL[cell.variant])


def report(tmp_path, **kwargs):
    runs = tmp_path / "runs"
    write_protocol(runs, **kwargs)
    states = {c: C.inspect(c, runs) for c in [*stage1_cells(SPEC), *stage2_cells(SPEC, CHOSEN)]}
    chosen = C.chosen_lrs(SPEC, states)
    return chosen, protocol_report.write(SPEC, states, chosen, tmp_path / "report", "test protocol")


def test_report_of_a_finished_two_size_protocol(tmp_path):
    chosen, text = report(tmp_path)
    assert chosen == CHOSEN  # the LR choice read back from the runs
    lr_rows = [line for line in text.split("## Stage 1")[1].split("## small")[0].splitlines() if line.startswith("| ")]
    assert "| ref | 2.5000 | **2.0000** | 0.01 ⚠ grid edge |" in lr_rows
    assert "| ln | diverged | diverged | diverged at every LR |" in lr_rows
    small = text.split("## small")[1].split("## wide")[0]
    assert "| gelu | 3 | -0.1000 |" in small and "**better**" in small  # paired over seeds 0, 1, 2
    assert "- **gelu**: better by 0.100 ± 0." in small
    wide = text.split("## wide")[1].split("## Does it hold")[0]
    assert "- **gelu**: worse by" in wide and "| ★ ref |" in wide
    scale = text.split("## Does it hold at scale?")[1]
    assert "**flips**" in next(line for line in scale.splitlines() if line.startswith("| gelu"))
    assert wide.count("Not in stage 2 (diverged at every LR of the grid): ln.") == 1
    assert "- small: gelu < ref" in scale and "- wide: ref < gelu" in scale
    for name in ("lr_sweep", "forest", "delta_vs_size", "val_curves_small", "val_curves_wide",
                 "activation_rms_small"):
        assert image.imread(tmp_path / "report" / f"{name}.png").ndim == 3, name
    assert (tmp_path / "report" / "results.md").read_text() == text


def test_report_of_a_half_done_protocol_says_what_is_missing(tmp_path):
    _, text = report(tmp_path, finished_seeds=(0,))  # stage 2 has only the stage-1 runs
    small = text.split("## small")[1].split("## wide")[0]
    assert "| gelu | 1 | -0.1000 | n/a | n/a |" in small and "no verdict" in small
    assert "Cells: 4 diverged, 8 finished, 8 missing." in text
    assert "seeds 0, 1, 2 (the stage-1 run is seed 0's)" in text
