"""The published ablation numbers are traceable: docs/ablation/protocol/per_seed.csv is its manifest's cells,
and the re-reading docs/ablation/README.md gives of the first protocol run (10 tests, Holm) follows from them."""
import csv

import yaml

from analysis.ablation.export import manifest_rows
from analysis.ablation.planning import paired_differences
from analysis.verdicts import judge
from tests.train_helpers import REPO

DOCS = REPO / "docs" / "ablation" / "protocol"


def manifest() -> dict:
    return yaml.safe_load((DOCS / "protocol.yaml").read_text())


def test_the_per_seed_csv_is_the_manifests_cells():
    rows = list(csv.DictReader(open(DOCS / "per_seed.csv")))
    expected = manifest_rows(manifest())
    assert len(rows) == len(expected) == 83  # 84 cells, one diverged
    for row, want in zip(rows, expected):
        assert (row["size"], row["variant"], float(row["lr"]), int(row["seed"]), row["stage"]) == (
            want["size"], want["variant"], want["lr"], want["seed"], want["stage"])
        assert float(row["val_bpb"]) == want["val_bpb"]


def test_under_holm_only_no_norm_survives_the_first_protocol():
    """Its report called 5 of 10 contrasts at α = 0.05 each (no_norm twice, qk_norm at h96, gelu at h192);
    as one family of 10, Holm-adjusted, only no_norm's two hold — and nothing is shown equivalent at ±0.01."""
    m = manifest()
    variants = [v for v in m["spec"]["variants"] if v != m["spec"]["reference"]]
    diffs = paired_differences(m, variants)
    family = {key: (d, [0.0] * len(d)) for key, d in diffs.items()}
    verdicts = judge(family, "all, own LR", alpha=0.05, margin=0.01)
    assert len(verdicts) == 10
    called = {k for k, v in verdicts.items() if v.outcome != "can't tell"}
    assert called == {"h96/no_norm", "h192/no_norm"} and {verdicts[k].outcome for k in called} == {"worse"}
    raw = {k for k, v in verdicts.items() if v.test.p < 0.05}
    assert raw == {"h96/no_norm", "h192/no_norm", "h96/qk_norm", "h192/gelu"}  # what the report called unadjusted
    assert round(verdicts["h192/gelu"].p_adjusted, 2) == 0.24 and round(verdicts["h96/qk_norm"].p_adjusted, 2) == 0.21
