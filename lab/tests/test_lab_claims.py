"""The studies' pages claim what their published files support (issue 67, point 5): each statistic is recomputed
here from the per-seed file it cites, with scipy and statsmodels alone, and the over-claim it replaced is gone.
Self-contained (the standard library, numpy, scipy, statsmodels), so it can move with the lab: change ROOT there."""

import csv
import json
import re
import statistics
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

ROOT = Path(__file__).resolve().parents[2]
EPOCH = ROOT / "docs" / "ablation" / "epoch-depth"
ARMS = ROOT / "docs" / "mup" / "arms"
MARGIN, ALPHA = 0.01, 0.05  # the default protocol's equivalence margin and α (docs/ablation/README.md)


def page(name: str) -> str:
    """The page with its line breaks folded to spaces, as a reader sees a sentence."""
    return " ".join((ROOT / name).read_text().split())


def readme_ablation_paragraph() -> str:
    text = page("README.md")
    return text.split("What the default protocol's run supports", 1)[1].split("**Generate, share, scale out**")[0]


def signed(x: float, decimals: int) -> str:
    return f"{x:+.{decimals}f}".replace("-", "−")


def git(*args: str) -> str:
    """Git's answer about this repository's history; skipped where the clone has no history (a shallow CI checkout)."""
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"git {' '.join(args)}: {done.stderr.strip()[:120]}")
    return done.stdout


# --- the ablation's epoch-depth run (README's paragraph, docs/ablation/README.md) ---


def cell_bpb() -> dict:
    """Stage 2 of per_seed.csv: {(size, variant, lr): [bpb of seeds 0–4]}."""
    cells = {}
    for r in csv.DictReader(open(EPOCH / "per_seed.csv")):
        if r["stage"] == "stage2":
            cells.setdefault((r["size"], r["variant"], r["lr"]), {})[int(r["seed"])] = float(r["val_bpb"])
    return {key: [by_seed[s] for s in sorted(by_seed)] for key, by_seed in cells.items()}


def own_lr_primary_family() -> dict:
    """The primary family at each variant's own LR, recomputed from per_seed.csv with the LRs contrasts.csv names:
    {(size, variant): (Δ, 95 % CI half-width, Holm p, TOST Holm p)}."""
    rows = [
        r for r in csv.DictReader(open(EPOCH / "contrasts.csv")) if (r["lr_choice"], r["family"]) == ("own", "primary")
    ]
    cells, tests = cell_bpb(), {}
    for r in rows:
        diff = np.subtract(
            cells[(r["size"], r["variant"], r["lr"])], cells[(r["size"], "rmsnorm_swiglu", r["reference_lr"])]
        )
        half = stats.t.ppf(0.975, len(diff) - 1) * stats.sem(diff)
        tost = max(
            stats.ttest_1samp(diff, -MARGIN, alternative="greater").pvalue,
            stats.ttest_1samp(diff, MARGIN, alternative="less").pvalue,
        )
        tests[(r["size"], r["variant"])] = (diff.mean(), half, stats.ttest_1samp(diff, 0).pvalue, tost)
    holm = multipletests([t[2] for t in tests.values()], method="holm")[1]
    tost_holm = multipletests([t[3] for t in tests.values()], method="holm")[1]
    return {key: (t[0], t[1], p, tp) for (key, t), p, tp in zip(tests.items(), holm, tost_holm)}


def test_readme_states_the_norm_result_as_cant_tell_at_both_depths_from_the_per_seed_file():
    family, paragraph = own_lr_primary_family(), readme_ablation_paragraph()
    shown = []
    for size, decimals in (("d2", 4), ("d6", 3)):
        delta, half, p, tost_p = family[(size, "layernorm")]
        assert p >= ALPHA and tost_p >= ALPHA  # neither a difference nor an equivalence: can't tell
        shown.append(f"{signed(delta, decimals)} ± {half:.{decimals}f}, Holm p = {p:.2f}")
    assert shown == ["−0.0068 ± 0.0076, Holm p = 0.15", "−0.003 ± 0.024, Holm p = 0.73"]
    assert f"LayerNorm vs RMSNorm: we can't tell at either depth ({shown[0]}; {shown[1]})." in paragraph
    assert '"can\'t tell" means too few seeds, never "the same"' in paragraph


def test_readme_does_not_call_the_epoch_depth_families_pre_registered():
    manifest = (EPOCH / "protocol.yaml").read_text()
    assert not re.search(r"^registrations:", manifest, re.M)  # no registration was recorded
    paragraph = readme_ablation_paragraph()
    assert "pre-registered family" not in paragraph
    assert "Holm per family, named before the run but not pre-registered, and study-wide" in paragraph


def test_the_ablation_page_says_precision_was_not_recorded_and_drops_the_untraceable_numbers():
    cells = list(csv.DictReader(open(EPOCH / "per_seed.csv")))
    assert len(cells) == 113 and {c["precision"] for c in cells} == {""}
    assert any(
        (c["size"], c["variant"], c["lr"], c["seed"]) == ("d2", "gelu", "0.002", "4") for c in cells
    )  # the cell the page names exists
    text = page("docs/ablation/README.md")
    assert f"**Precision: not recorded** in {len(cells)} of {len(cells)} cells" in text
    assert "`d2/gelu/lr0.002_seed4`" in text
    for untraced in ("112 cells in bf16", "2.3051", "+0.0399", "Holm p = 0.0014"):
        assert untraced not in text, untraced


# --- μP (docs/mup.md) ---


def jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_muon_transfer_is_worded_as_an_argmin_not_a_tested_transfer():
    runs = [r for r in jsonl(ROOT / "docs" / "mup" / "transfer" / "results.jsonl") if r["optimizer"] == "muon"]
    assert {r["seed"] for r in runs} == {0, 1}  # 2-seed means
    best = {}
    for p in ("mup", "sp"):
        means = {}
        for r in runs:
            if r["parametrization"] == p:
                means.setdefault(r["width"], {}).setdefault(r["lr"], []).append(r["val_loss"])
        best[p] = {w: min(lrs, key=lambda lr: statistics.mean(lrs[lr])) for w, lrs in means.items()}
    assert len(set(best["mup"].values())) == 1 and len(set(best["sp"].values())) > 1  # an argmin that stays put
    assert re.search(r"max_steps: 150\b", (ROOT / "lab" / "configs" / "experiment" / "mup_transfer.yaml").read_text())
    text = page("docs/mup.md")
    assert (
        "What this supports: with Muon under μP, an lr tuned at width 64 is where to start up to 512, not a tested "
        "transfer (an argmin of 2-seed means at 150 steps)." in text
    )
    assert "tune the lr at width 64 under μP and use it up to 512" not in text


def commit_time(commit: str) -> datetime:
    return datetime.fromtimestamp(int(git("show", "-s", "--format=%ct", commit)), tz=timezone.utc)


def run_time(row: dict) -> datetime:
    return datetime.strptime(row["time"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)


def test_the_arms_rules_are_said_to_have_entered_git_with_and_after_their_results():
    """arms.py came in the commit that published seed 0 of two arms, run before it; compare_arms 1 h 10 min later;
    the 2×2 after its four arms had finished: not pre-registered."""
    first = git("show", "--name-status", "--format=", "116598e")
    assert "A\tstudies/mup/arms.py" in first
    assert "A\tdocs/mup/arms/control/results.jsonl" in first and "A\tdocs/mup/arms/sp_scale/results.jsonl" in first
    published = jsonl_at("116598e", "docs/mup/arms/control/results.jsonl")
    assert {r["seed"] for r in published} == {0}
    assert max(run_time(r) for r in published) < commit_time("116598e")
    assert "def compare_arms" not in git("show", "116598e:studies/mup/arms.py")
    assert "+def compare_arms" in git("show", "8429548", "--", "studies/mup/arms.py")
    minutes = (commit_time("8429548") - commit_time("116598e")).total_seconds() // 60
    assert f"{minutes // 60:.0f} h {minutes % 60:.0f} min" == "1 h 10 min"
    assert "A\tstudies/mup/factorial.py" in git("show", "--name-status", "--format=", "e84e93b")
    factorial_arms = ("control", "sp_scale", "hidden_lr", "sp_scale_hidden_lr")
    assert max(run_time(r) for a in factorial_arms for r in jsonl(ARMS / a / "results.jsonl")) < commit_time("e84e93b")
    text = page("docs/mup.md")
    assert (
        "are not pre-registered: `arms.py` entered git in `116598e` with seed 0 of `control` and `sp_scale`, already "
        "run; `compare_arms` in `8429548`, 1 h 10 min later; the 2×2 in `e84e93b`, after its four arms had finished."
    ) in text
    assert "fixed before the results were read" not in text and "before their results were read" not in text
    assert "rules fixed before their runs" not in page("docs/testing.md")


def jsonl_at(commit: str, path: str) -> list:
    return [json.loads(line) for line in git("show", f"{commit}:{path}").splitlines() if line.strip()]


def logit_rms_at_150(arm: str, width: int = 512) -> dict:
    """{lr: the attention logits' RMS at step 150, averaged over layers and seeds}, as results.md's schedule table."""
    by_lr = {}
    for r in jsonl(ARMS / arm / "results.jsonl"):
        if r["width"] == width:
            at = r["schedule"]["step"].index(150)
            by_lr.setdefault(r["lr"], []).append(statistics.mean(r["schedule"]["attn_logits"][at]))
    return {lr: statistics.mean(v) for lr, v in by_lr.items()}


def test_the_attention_logit_rms_is_compared_at_the_same_learning_rate():
    hidden, control = logit_rms_at_150("hidden_lr"), logit_rms_at_150("control")
    (h9, c9), (h8, c8) = ((f"{hidden[lr]:.2f}", f"{control[lr]:.2f}") for lr in (2**-9, 2**-8))
    assert (h9, c9, h8, c8) == ("2.91", "1.51", "8.83", "2.55")
    text = page("docs/mup.md")
    assert (
        f"at width 512 and the same lr, the attention logits' RMS at step 150 is {h9} (`hidden_lr`) against the "
        f"control's {c9} at 2⁻⁹, {h8} against {c8} at 2⁻⁸" in text
    )
    assert "8.83 (`hidden_lr`) against the control's 1.51" not in text


def test_the_machine_sentence_keeps_only_what_a_published_file_holds():
    cells = {}
    for r in jsonl(ARMS / "control" / "results.jsonl"):
        cells.setdefault((r["width"], r["lr"]), []).append(r["val_loss"])
    sds = [statistics.stdev(v) for v in cells.values()]
    text = page("docs/mup.md")
    assert f"the control's seeds: sd {min(sds):.2f}–{max(sds):.2f} nats" in text
    assert "what the machine alone moves is in no published file" in text
    assert "5e-5" not in text and "2e-4 nats" not in text


# --- the speedrun (docs/speedrun.md) ---


def report_seeds(text: str, recipe: str) -> list:
    """The "bpb per seed" cell of a recipe's row in a speedrun report table."""
    row = re.search(rf"^\| {re.escape(recipe)} \|.*$", text, re.M).group(0)
    cells = [c.strip() for c in row.strip("|").split("|")]
    return [float(x) for x in re.findall(r"\d\.\d+", cells[6])]


def test_lr_1e_2_against_6e_3_at_one_layer_is_a_cant_tell():
    text = (ROOT / "docs" / "speedrun.md").read_text()
    high, low = report_seeds(text, "muon_wu25_lr1e-2_layers1"), report_seeds(text, "muon_wu25_lr6e-3_layers1")
    by_seed = " and ".join(signed(h - lo, 4) for h, lo in zip(high, low))
    p = stats.ttest_rel(high, low).pvalue
    assert p >= ALPHA
    said = " ".join(text.split())
    assert (
        f"**lr 1e-2 against 6e-3 at 1 layer, 2 layers, WSD at 3 layers: can't tell yet** ({by_seed} by seed, "
        f"paired p = {p:.2f};" in said
    )
    assert "ties 6e-3" not in said


def test_the_second_campaigns_lr_1e_2_is_a_cant_tell_from_its_report_in_git():
    report = git("show", "af19e9b^:docs/speedrun.md")  # the full report, before the page kept one table row of it
    high, low = report_seeds(report, "muon_wu25_lr1e-2"), report_seeds(report, "muon_wu25_lr6e-3")
    p = stats.ttest_rel(high, low).pvalue
    assert p >= ALPHA
    assert f"| lr 1e-2 against 6e-3 can't tell (paired p = {p:.2f}); batch 8 can't tell |" in page("docs/speedrun.md")


def test_the_horizon_figures_that_trace_to_no_published_file_are_gone():
    text = page("docs/speedrun.md")
    for untraced in ("1.9715", "1.9231", "11.8 min", "26.8 min"):
        assert untraced not in text, untraced
