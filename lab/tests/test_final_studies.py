"""The studies whose code left the tree (the speedrun campaigns; μP's arms and 2×2, after 2c134f9): every number their
pages publish is recomputed here from the published files, with scipy and statsmodels alone, by the rules the pages
state — a paired t-test over seeds with its 95 % interval, Holm over the lrs of one question."""

import functools
import itertools
import json
import re
from pathlib import Path

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests

ROOT = Path(__file__).resolve().parents[2]
ARMS = ROOT / "docs" / "mup" / "arms"
NARROW, WIDE, ALPHA = 64, 512, 0.05


def page(name: str) -> str:
    return (ROOT / name).read_text()


def close(printed: str, value: float) -> bool:
    """A printed number equals the value to the digits it shows."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(float(printed) - value) <= 0.5 * 10**-decimals + 1e-12


def paired(a, b) -> tuple:
    """(Δ = mean(a − b), 95 % CI low, high, two-sided p) of the paired t-test."""
    result = stats.ttest_rel(a, b)
    ci = result.confidence_interval(0.95)
    return float(np.mean(np.subtract(a, b))), float(ci.low), float(ci.high), float(result.pvalue)


def holm(tests: dict) -> dict:
    return dict(zip(tests, multipletests([t[3] for t in tests.values()], method="holm")[1]))


# --- μP's arms (docs/mup.md, docs/mup/arms/<arm>/results.jsonl) ---


def gaps(arm: str) -> dict:
    """{lr: {seed: L(512) − L(64)}}: every run of the published arms finished."""
    loss = {}
    for line in (ARMS / arm / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        assert r["status"] == "finished"
        loss[(r["lr"], r["seed"], r["width"])] = r["val_loss"]
    lrs, seeds = sorted({k[0] for k in loss}), sorted({k[1] for k in loss})
    return {lr: {s: loss[(lr, s, WIDE)] - loss[(lr, s, NARROW)] for s in seeds} for lr in lrs}


def family(contrast: dict) -> dict:
    """{lr: (Δ, low, high, p, Holm p)} of one question asked at each lr: the per-seed contrast against 0."""
    tests = {lr: paired(values, np.zeros(len(values))) for lr, values in contrast.items()}
    return {lr: (*t, p) for (lr, t), p in zip(tests.items(), holm(tests).values())}


@functools.cache  # the published runs do not change within a session: two tests read the same answers
def questions() -> dict:
    """Every question the page's table answers, by its row name: each arm's gap, each arm's gap against the control's,
    and the 2×2's interaction and main effects (A = sp_scale, B = hidden_lr, AB = both)."""
    g = {arm: gaps(arm) for arm in ("control", "sp_scale", "hidden_lr", "sp_scale_hidden_lr", "zero_query")}

    def per_seed(f):
        return {lr: [f(*(g[a][lr][s] for a in g)) for s in sorted(g["control"][lr])] for lr in g["control"]}

    asked = {f"`{arm}`": per_seed(lambda *x, i=i: x[i]) for i, arm in enumerate(g)}
    for i, arm in list(enumerate(g))[1:]:
        asked[f"`{arm}` against `control`"] = per_seed(lambda *x, i=i: x[i] - x[0])
    asked["2×2, interaction"] = per_seed(lambda c, a, b, ab, _: (ab - b) - (a - c))
    asked["2×2, main effect of `sp_scale`"] = per_seed(lambda c, a, b, ab, _: ((a + ab) - (c + b)) / 2)
    asked["2×2, main effect of `hidden_lr`"] = per_seed(lambda c, a, b, ab, _: ((b + ab) - (c + a)) / 2)
    return {name: family(contrast) for name, contrast in asked.items()}


def test_the_arms_table_is_every_call_the_rule_makes_of_the_published_runs():
    rows = re.findall(r"^\| (`[^|]*|2×2[^|]*) \| ([\d.]+) \| ([-+\d.]+) \[([-+\d.]+), ([-+\d.]+)\] \| ([\d.]+) \| ([^|]+) \|$",
                      page("docs/mup.md"), re.M)  # fmt: skip
    answers = questions()
    called = {
        (name, f"{lr:.3g}") for name, by_lr in answers.items() for lr, (_, _, _, _, p) in by_lr.items() if p < ALPHA
    }
    assert {(name, lr) for name, lr, *_ in rows} == called and len(called) == 9
    for name, lr, delta, low, high, p, call in rows:
        (d, lo, hi, _, p_holm) = next(v for k, v in answers[name].items() if f"{k:.3g}" == lr)
        assert close(delta, d) and close(low, lo) and close(high, hi) and close(p, p_holm), (name, lr)
        gap = "against" in name or "2×2" in name
        assert call == (
            {True: "widens the gap", False: "worse"}[gap] if d > 0 else "narrows the gap" if gap else "better"
        )


def test_each_arm_not_shown_worse_states_its_largest_upper_bound():
    text, answers = " ".join(page("docs/mup.md").split()), questions()
    for arm in ("control", "sp_scale", "zero_query"):
        by_lr = answers[f"`{arm}`"]
        assert all(p >= ALPHA for *_, p in by_lr.values())
        top = max(hi for _, _, hi, _, _ in by_lr.values())
        assert (
            f"`{arm}`: width 512 is not shown worse than 64 at any lr (3 seeds; upper 95 % bounds up to {top:+.2f} nats)"
            in text
        )
    for arm in ("sp_scale_hidden_lr", "zero_query"):
        assert f"`{arm}` against `control`: no lr where it is shown to move the gap" in text
        assert all(p >= ALPHA for *_, p in answers[f"`{arm}` against `control`"].values())
    assert all(p >= ALPHA for *_, p in answers["2×2, interaction"].values())  # "No interaction is shown at any lr"


def test_the_narrow_width_runs_of_the_identity_arms_match_the_control_to_the_last_digit():
    def narrow(arm):
        rows = [json.loads(line) for line in (ARMS / arm / "results.jsonl").read_text().splitlines()]
        return {(r["lr"], r["seed"]): r["val_loss"] for r in rows if r["width"] == NARROW}

    control = narrow("control")
    for arm in ("sp_scale", "hidden_lr", "sp_scale_hidden_lr"):
        assert narrow(arm) == control and len(control) == 15
    assert "(15 of 15 each): the arms differ in their setting and nothing else" in " ".join(page("docs/mup.md").split())


# --- the speedrun's fourth campaign (docs/speedrun.md: its report table holds every run's bpb) ---


def campaign() -> dict:
    """{recipe: the report row's cells} of the fourth campaign's table."""
    table = page("docs/speedrun.md").split("Its report (", 1)[1].split("What it says:", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| muon")]
    return {cells[0]: cells for cells in rows}


def within(printed: str, values: list) -> bool:
    """The printed number lies in the range the statistic takes over the inputs' rounding, to the digits shown."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return min(values) - 0.5 * 10**-decimals <= float(printed) <= max(values) + 0.5 * 10**-decimals + 1e-12


def test_the_fourth_campaigns_means_and_paired_verdicts_follow_from_its_bpb_per_seed():
    """The table prints each run's bpb to 4 decimals: every statistic is recomputed at each corner of that rounding
    (±0.00005 per value) and the printed number must lie in the range they span."""
    rows = campaign()
    bpb = {name: [float(x) for x in re.findall(r"\d\.\d+", cells[6])] for name, cells in rows.items()}
    reference = bpb["muon_wu25_lr6e-3_layers3"]
    assert len(rows) == 6
    for name, cells in rows.items():
        values = bpb[name]
        mean = cells[7].split(" ± ")
        assert close(mean[0], np.mean(values))
        if len(values) < 2:
            assert cells[8] == f"{values[0] - reference[0]:+.4f} (1 seed)" and cells[9] == "n/a"
            continue
        spreads = [np.std(np.add(values, shift), ddof=1) for shift in itertools.product((-5e-5, 5e-5), repeat=2)]
        assert within(mean[1], spreads), (name, mean[1])
        if name == "muon_wu25_lr6e-3_layers3":
            continue
        corners = [
            paired(np.add(values, shift[:2]), np.add(reference, shift[2:]))
            for shift in itertools.product((-5e-5, 5e-5), repeat=4)
        ]
        delta, low, high = re.fullmatch(r"([-+\d.]+) \[([-+\d.]+), ([-+\d.]+)\]", cells[8]).groups()
        for printed, i in ((delta, 0), (low, 1), (high, 2), (cells[9], 3)):
            assert within(printed, [c[i] for c in corners]), (name, printed)
        d, _, _, p = paired(values, reference)
        said = "better by" if p < ALPHA and d < 0 else "can't tell yet"
        assert cells[10].startswith(said) and f"p = {cells[9]}, 2 paired seeds" in cells[10], name
    verdict = rows["muon_wu25_lr6e-3_layers1"][10].split(", 2 paired seeds")[0]  # checked above
    assert verdict.startswith("better by") and f"**One layer wins: {verdict}, on 2 paired seeds**" in " ".join(
        page("docs/speedrun.md").split()
    )
