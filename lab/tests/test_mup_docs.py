"""docs/mup.md's transfer experiment traces to its per-run file: the tables are what the report code makes of
docs/mup/transfer/results.jsonl, and the verdicts the text states (where each best lr sits, how far it
moved, the seed noise) follow from it; the arms' results.md are the same report of their runs."""

import csv
import json
import statistics

import yaml

from lab.mup_transfer import NAMES, Cell, TransferSpec, best_lrs, drift, markdown, mean_losses, read_results
from tests.train_helpers import REPO

STORED = REPO / "docs" / "mup" / "transfer"


def stored():
    spec = TransferSpec.from_dict(json.loads((STORED / "spec.json").read_text()))
    return spec, read_results(STORED)


def test_the_tables_in_the_docs_are_the_reports_of_the_stored_runs():
    spec, results = stored()
    assert len(results) == len(spec.cells()) == 192  # every cell of the grown grid ran
    tables = markdown(spec, mean_losses(spec, results))
    assert tables == (STORED / "results.md").read_text()
    text = (REPO / "docs" / "mup.md").read_text()
    assert "(mup/transfer/results.md)" in text and "(mup/transfer/transfer.png)" in text


def test_the_stated_verdicts_follow_from_the_runs():
    spec, results = stored()
    losses = mean_losses(spec, results)
    best = best_lrs(losses)
    assert set(best[("muon", "mup")].values()) == {2**-5} and max(spec.lrs) > 2**-5  # put, and interior
    assert best[("muon", "sp")][64] == 2**-5 and drift(best[("muon", "sp")]) == -2
    assert best[("adamw", "mup")] == {64: 2**-7, 128: 2**-7, 256: 2**-7, 512: 2**-8}
    assert best[("adamw", "sp")] == {64: 2**-7, 128: 2**-9, 256: 2**-9, 512: 2**-9}
    muon_mup = losses[("muon", "mup")]
    assert all(muon_mup[a][lr] > muon_mup[b][lr] for lr in spec.lrs for a, b in ((64, 128), (128, 256), (256, 512)))
    adamw_mup = losses[("adamw", "mup")]
    assert all(adamw_mup[512][lr] > adamw_mup[256][lr] for lr in spec.lrs)  # the anomaly the text reports
    spread = {
        o: statistics.median(
            abs(results[c.name]["val_loss"] - results[c.name[:-1] + "1"]["val_loss"])
            for c in spec.cells()
            if c.optimizer == o and c.seed == 0
        )
        for o in spec.optimizers
    }
    assert round(spread["muon"], 3) == 0.013 and round(spread["adamw"], 3) == 0.046


ARMS = REPO / "docs" / "mup" / "arms"


def published_arms() -> list:
    return sorted(p for p in ARMS.iterdir() if (p / "spec.json").exists())


QUANTITIES = {"attn_logits": "attention-logit RMS", "weight_change": "weight change since the last eval"}


def schedule_table(spec: TransferSpec, results: dict) -> str:
    """The arms' schedule table (their code left after 2c134f9): at each width's best lr, each evaluation's attention
    logits' RMS and weight change, averaged over the layers and then over the seeds."""
    out = [
        "## Along the schedule, at each width's best lr",
        "",
        "Each evaluation's value, averaged over the layers and the seeds: the attention logits' RMS (q·kᵀ × scale on "
        "the first validation sequence) and each block's relative weight change since the previous evaluation "
        "(|W − W_prev| / |W_prev|; the first: since initialisation).",
        "",
    ]
    for (optimizer, parametrization), per_width in sorted(best_lrs(mean_losses(spec, results)).items()):
        runs = {
            w: [results[Cell(optimizer, parametrization, w, lr, s).name]["schedule"] for s in spec.seeds]
            for w, lr in per_width.items()
        }
        steps = next(iter(runs.values()))[0]["step"]
        assert all(r["step"] == steps for seeds in runs.values() for r in seeds)
        out += [
            f"### {NAMES[optimizer]} · {NAMES[parametrization]}",
            "",
            "| width | lr | quantity | " + " | ".join(f"step {s}" for s in steps) + " |",
            "|---:|---:|---|" + "---:|" * len(steps),
        ]
        for width, seeds in sorted(runs.items()):
            for quantity, label in QUANTITIES.items():
                means = [statistics.fmean(statistics.fmean(r[quantity][i]) for r in seeds) for i in range(len(steps))]
                out.append(
                    f"| {width} | {per_width[width]:.3g} | {label} | " + " | ".join(f"{v:.4g}" for v in means) + " |"
                )
        out.append("")
    return "\n".join(out)


def test_each_published_arm_is_its_report_and_the_docs_say_how_far_it_got():
    """docs/mup/arms/<arm>: results.md is the report's loss tables of results.jsonl and the schedule's table of its
    runs (attention logits, weight change), and docs/mup.md says how many of the arm's runs are done."""
    arms, text = published_arms(), (REPO / "docs" / "mup.md").read_text()
    assert [p.name for p in arms] == ["control", "hidden_lr", "sp_scale", "sp_scale_hidden_lr", "zero_query"]
    for arm in arms:
        spec = TransferSpec.from_dict(json.loads((arm / "spec.json").read_text()))
        results = read_results(arm)
        report = markdown(spec, mean_losses(spec, results)) + "\n" + schedule_table(spec, results)
        assert (arm / "results.md").read_text() == report
        assert f"`{arm.name}`: {len(results)} of {len(spec.cells())} runs" in text


def test_the_transfer_and_arms_claims_say_no_more_than_their_runs():
    """The Muon transfer is an argmin on a ×2 grid, not a test; the arms were not shown to help; width_mup's reuse
    of one LR under AdamW is flagged as the assumption docs/mup.md says it is."""
    mup = " ".join((REPO / "docs" / "mup.md").read_text().split())
    assert "μP transfers, SP does not" not in mup and "an argmin of 2-seed means on a ×2 grid" in mup
    assert "No arm makes width 512 better" not in mup and "No arm was shown to make width 512 better" in mup
    assert "AdamW: we can't tell" in mup
    width = (REPO / "lab" / "configs" / "protocol" / "width_mup.yaml").read_text()
    assert yaml.safe_load(width)["experiment"] == "ablation_epoch" and "the reused LRs are an assumption" in width


def test_the_bimodal_d6_gelu_cell_is_what_per_seed_csv_holds():
    rows = csv.DictReader(open(REPO / "docs" / "ablation" / "epoch-depth" / "per_seed.csv"))
    bpb = sorted(
        float(r["val_bpb"])
        for r in rows
        if (r["stage"], r["size"], r["variant"], r["lr"]) == ("stage2", "d6", "gelu", "0.008")
    )
    assert len(bpb) == 5 and [round(b, 2) for b in bpb[3:]] == [2.46, 2.47] and max(bpb[:3]) < 2.25
    assert (
        "2 of\n5 seeds near 2.46 bpb, the other 3 near 2.24" in (REPO / "docs" / "ablation" / "README.md").read_text()
    )
