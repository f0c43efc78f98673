"""docs/mup.md's transfer experiment traces to its per-run file: the tables are what the report code makes of
docs/mup/transfer/results.jsonl, and the verdicts the text states (where each best lr sits, how far it
moved, the seed noise) follow from it; the arms' results.md are the same report of their runs."""

import csv
import json
import statistics

import yaml

from lab.mup_transfer import TransferSpec, best_lrs, drift, markdown, mean_losses, read_results, report_text
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


def test_each_published_arm_is_its_report_and_the_docs_say_how_far_it_got():
    """docs/mup/arms/<arm>: results.md is what the report code makes of results.jsonl, every run kept its
    schedule (attention logits, weight change), and docs/mup.md says how many of the arm's runs are done."""
    arms, text = published_arms(), (REPO / "docs" / "mup.md").read_text()
    assert [p.name for p in arms] == ["control", "hidden_lr", "sp_scale", "sp_scale_hidden_lr", "zero_query"]
    for arm in arms:
        spec = TransferSpec.from_dict(json.loads((arm / "spec.json").read_text()))
        results = read_results(arm)
        assert (arm / "results.md").read_text() == report_text(spec, results)
        assert results and all("schedule" in row for row in results.values())
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
