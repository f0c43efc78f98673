"""lab/speedrun_campaign.py (lab/speedrun/campaign.py) end to end on a tiny model (2
recipes × 2 seeds, a budget of seconds), its resume and its bad input, and the report's judgement.
The calibration arithmetic: test_speedrun_timing.py; the CPU lock: test_jobs.py."""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

import lab.launcher
from analysis.stats import decimals, paired_t
from lab import speedrun as S
from lab.looks import LookError
from lab.speedrun.campaign import ALWAYS, Campaign, check_step_cost
from lab.speedrun_campaign import compose, main, parse_args
from tests import forked
from tests.train_helpers import REPO


def test_report_marks_a_win_that_had_more_loop_time_than_the_reference():
    """Fixed step counts land near the budget, not on it: the report says how much time each recipe had
    relative to the reference, and marks a recipe that had more beyond the tolerance."""
    from lab.speedrun.report import report

    spec = S.Spec(
        recipes={"base": [], "slow": ["optim.lr=1e-2"], "quick": ["optim.lr=2e-2"]},
        reference="base",
        budget_s=100.0,
        tolerance=0.03,
    )

    def run(seed, bpb, loop_s):
        return {"bpb": bpb, "loop_s": loop_s, "max_steps": 10, "tokens": 1000, "tokens_per_s": 10.0, "flags": []}

    results = {
        "base": {0: run(0, 2.00, 100.0), 1: run(1, 2.02, 98.0)},
        "slow": {0: run(0, 1.90, 110.0), 1: run(1, 1.93, 108.0)},  # +10.1 % of the reference's time
        "quick": {0: run(0, 1.95, 95.0), 1: run(1, 1.96, 93.1)},
    }  # -5.0 %
    rows = {
        line.split(" | ")[0][2:]: line for line in report(spec, results, {}, "m").splitlines() if line.startswith("| ")
    }
    assert rows["slow"].endswith("| +10.1% ⚠ more time |")
    assert rows["quick"].endswith("| -5.0% |")
    assert rows["base"].endswith("| — |")


# ---- end to end on a tiny model ------------------------------------------------------------------------

BUDGET = 2.0
RECIPES = {
    "reference": "ref",
    "budget_s": BUDGET,
    "seeds": 2,
    "probe_steps": 8,
    "tolerance": 0.5,
    "recipes": {"ref": [], "fast_lr": ["optim.lr=1e-2"]},
    "step_cost": {"fast_lr": 1.0},
}
TINY = ["debug=tiny", "trainer.num_threads=1", "trainer.peak_tflops=1", "trainer.precision=fp32"]


CACHES = []  # the inductor cache directory each train.py run was given


def speedrun(root, cache, *args):
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("OMP_NUM_THREADS", "1")
        # train.py runs forked from a server that has imported torch already (tests/forked.py): real
        # processes with their own exit status and log, without ~6 s of interpreter start-up each.
        fork = forked.popen_forking_train_py(subprocess.Popen)

        def popen(command, env=None, **kwargs):
            if str(command[1:2]).endswith("train.py']"):
                CACHES.append(env["TORCHINDUCTOR_CACHE_DIR"])
            return fork(command, env=env, **kwargs)

        mp.setattr(lab.launcher.subprocess, "Popen", popen)
        status = main(
            [
                "--recipes",
                str(root / "recipes.yaml"),
                "--dir",
                str(root / "runs"),
                *args,
                *TINY,
                f"data.cache_dir={cache}",
            ]
        )
    assert status == 0, out.getvalue()[-3000:]
    return out.getvalue()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(root, data cache, what the whole speedrun printed)."""
    root, cache = tmp_path_factory.mktemp("speedrun"), tmp_path_factory.mktemp("cache")
    (root / "recipes.yaml").write_text(yaml.safe_dump(RECIPES))
    return root, cache, speedrun(root, cache)


def todo(out: str, probes: int, runs: int) -> int:
    """Where the cost line ("to do: P probe(s) (~150 s each) and R run(s) × …") says P probes and R runs."""
    found = re.search(rf"to do: {probes} probe\(s\) \(~\d+ s each\) and {runs} run\(s\)", out)
    assert found, out[:500]
    return found.start()


def results(runs_dir):
    return {
        (p.parent.parent.name, p.parent.name): json.loads(p.read_text()) for p in runs_dir.glob("*/seed*/result.json")
    }


@pytest.mark.serial
def test_seeds_of_a_recipe_run_the_calibrated_steps_and_fill_the_budget(finished):
    root, cache, out = finished
    assert todo(out, probes=1, runs=4) < out.index("==> ref: probe")  # the cost comes first
    # fast_lr changes only the optimizer (step_cost 1): the reference's probe and steps, no probe of its own
    ref, fast = (json.loads((root / "runs" / r / "calibration.json").read_text()) for r in ("ref", "fast_lr"))
    assert (fast["max_steps"], fast["steps_from"], fast["timing"]) == (ref["max_steps"], "ref", ref["timing"])
    assert not (root / "runs" / "fast_lr" / "probe").exists() and "==> fast_lr: probe" not in out
    for recipe in ("ref", "fast_lr"):
        cal = json.loads((root / "runs" / recipe / "calibration.json").read_text())
        assert cal["predicted_loop_s"] <= BUDGET
        for seed in (0, 1):
            run = root / "runs" / recipe / f"seed{seed}"
            config = yaml.safe_load((run / "train" / "config.yaml").read_text())
            assert (config["trainer"]["max_steps"], config["seed"]) == (cal["max_steps"], seed)
            assert config["logger"]["wandb"] == "disabled"  # logger=none: no wandb process
            result = json.loads((run / "result.json").read_text())
            state = json.loads(
                (run / "train" / "checkpoints" / f"step_{cal['max_steps']:07d}" / "state.json").read_text()
            )
            assert result["loop_s"] == state["elapsed_before"]
            # How near the budget a run lands is measured, not assumed (timing is a benchmark's business):
            # the result carries its loop time and is flagged exactly when it misses the budget or ran slow.
            assert result["flags"] == S.run_flags(
                result["loop_s"], BUDGET, RECIPES["tolerance"], result["tokens_per_s"], cal["timing"]["tokens_per_s"]
            )


@pytest.mark.serial
def test_every_probe_and_run_compiles_in_a_fresh_inductor_cache_and_logs(finished):
    """The same (cold) compile in the probe and the runs, so the calibration's fixed cost is what every
    run pays (one shared cache let later runs skip it and land under budget)."""
    root, _, _ = finished
    first = CACHES[:5]  # the fixture's probe and 4 runs
    assert len(first) == 5 and len(set(first)) == 5 and not any(os.path.exists(c) for c in first)
    for log in [*(root / "runs").glob("*/probe.log"), *(root / "runs").glob("*/seed*/train.log")]:
        assert "bits/byte" in log.read_text() or "bpb" in log.read_text(), log


@pytest.mark.serial
def test_each_run_is_scored_on_the_whole_validation_split(finished):
    root, cache, _ = finished
    meta = json.loads(next(cache.glob("*/meta.json")).read_text())
    for result in results(root / "runs").values():
        scored = json.loads((root / "runs" / result["recipe"] / f"seed{result['seed']}" / "eval.json").read_text())
        assert scored["tokens"] == meta["val_tokens"] and scored["bytes"] == meta["val_bytes"]
        assert result["bpb"] == scored["bits_per_byte"]


@pytest.mark.serial
def test_report_judges_the_recipe_by_its_paired_seed_differences(finished):
    root, _, out = finished
    r = results(root / "runs")
    t = paired_t([r[("fast_lr", f"seed{s}")]["bpb"] for s in (0, 1)], [r[("ref", f"seed{s}")]["bpb"] for s in (0, 1)])
    row = next(line for line in (root / "runs" / "report.md").read_text().splitlines() if line.startswith("| fast_lr"))
    d = decimals(t.half_width)  # as many decimals as the interval's two significant digits need
    assert f"| {t.delta:+.{d}f} [{t.low:+.{d}f}, {t.high:+.{d}f}] |" in row  # mean paired Δ and the paired interval
    assert "no verdict: 2 paired seeds (1 dof) and no pooled spread of 2+ dof" in row  # one recipe: nothing to pool
    assert "report:" in out


@pytest.mark.serial
def test_a_finished_campaign_takes_no_more_seeds_without_a_sequential_design(finished, tmp_path):
    root, cache, _ = finished
    shutil.copytree(root, tmp_path / "copy")
    runs = tmp_path / "copy" / "runs"
    looks = json.loads((runs / "looks.json").read_text())
    assert looks[-1]["seeds"] == {"ref": [0, 1], "fast_lr": [0, 1]} and not looks[-1]["sequential"]
    with pytest.raises(LookError, match=r"(ref|fast_lr): seeds 2 would be added after a look at seeds 0, 1"):
        speedrun(tmp_path / "copy", cache, "--seeds", "3", "--dry-run")
    out = speedrun(tmp_path / "copy", cache, "--seeds", "3", "--dry-run", "--sequential")
    assert todo(out, probes=0, runs=2) >= 0  # stated: the third seed of each recipe may run


@pytest.mark.serial
def test_rerun_skips_finished_runs_and_redoes_a_cut_off_one(finished, tmp_path):
    root, cache, _ = finished
    shutil.copytree(root, tmp_path / "copy")
    copy = tmp_path / "copy"
    before = {k: (copy / "runs" / k[0] / k[1] / "result.json").stat().st_mtime_ns for k in results(copy / "runs")}
    todo(speedrun(copy, cache), probes=0, runs=0)
    cut = copy / "runs" / "fast_lr" / "seed1"
    (cut / "result.json").unlink()  # killed after training, before its result was written
    out = speedrun(copy, cache)
    todo(out, probes=0, runs=1)
    assert "==> fast_lr seed 1" in out and "==> ref seed" not in out
    assert list((copy / "runs" / "discarded").glob("*/fast_lr/seed1/train/config.yaml"))  # kept, out of the way
    after = {k: (copy / "runs" / k[0] / k[1] / "result.json").stat().st_mtime_ns for k in results(copy / "runs")}
    assert {k: v for k, v in after.items() if k != ("fast_lr", "seed1")} == {
        k: v for k, v in before.items() if k != ("fast_lr", "seed1")
    }
    assert (
        json.loads((cut / "result.json").read_text())["max_steps"]
        == results(root / "runs")[("fast_lr", "seed1")]["max_steps"]
    )


@pytest.mark.serial
def test_a_recipe_changed_under_its_name_is_refused(finished, tmp_path):
    root, cache, _ = finished
    shutil.copytree(root, tmp_path / "copy")
    changed = {**RECIPES, "recipes": {"ref": [], "fast_lr": ["optim.lr=2e-2"]}}
    (tmp_path / "copy" / "recipes.yaml").write_text(yaml.safe_dump(changed))
    with pytest.raises(S.SpeedrunError, match="must not change under its name"):
        speedrun(tmp_path / "copy", cache, "--seeds", "3")


@pytest.mark.serial  # `finished` trains: wherever it runs first, it must run alone
def test_a_recipe_taken_out_of_step_cost_is_refused(finished, tmp_path):
    """Its runs trained the reference's steps; with its own probe it would be another recipe."""
    root, cache, _ = finished
    shutil.copytree(root, tmp_path / "copy")
    (tmp_path / "copy" / "recipes.yaml").write_text(yaml.safe_dump({**RECIPES, "step_cost": {}}))
    with pytest.raises(S.SpeedrunError, match=r"from the reference's probe × 1;.*must not change under its name"):
        speedrun(tmp_path / "copy", cache, "--seeds", "3")


@pytest.mark.parametrize(
    "change, section",
    [("model.hidden_size=32", "model"), ("trainer.micro_batch_size=2", "trainer"), ("data.val_fraction=0.2", "data")],
)
def test_a_step_cost_recipe_that_changes_more_than_optimizer_or_depth_is_refused_before_anything_trains(
    tmp_path, change, section
):
    spec = {
        **RECIPES,
        "recipes": {"ref": [], "other": [change], "deep": ["model.n_layers=1"]},
        "step_cost": {"other": 1.0, "deep": 0.6},
    }
    (tmp_path / "recipes.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(
        S.SpeedrunError, match=f"step_cost: other changes {section}, not only the optimizer or the depth"
    ):
        main(["--recipes", str(tmp_path / "recipes.yaml"), "--dir", str(tmp_path / "runs"), *TINY])
    assert not list((tmp_path / "runs").glob("*/probe"))


def test_a_depth_change_may_take_a_side_by_side_step_cost(tmp_path):
    """bench_model.py --layers measures a depth's step cost in one process: such a recipe is accepted."""
    spec = S.Spec(recipes={"ref": [], "deep": ["model.n_layers=1"]}, reference="ref", step_cost={"deep": 0.6})
    check_step_cost(Campaign(parse_args(["--dir", str(tmp_path), *TINY]), spec, compose))  # no error


def test_bad_input_is_one_error_line(tmp_path):
    (tmp_path / "recipes.yaml").write_text(yaml.safe_dump(RECIPES, sort_keys=False))  # recipes in the file's order
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.speedrun_campaign",
            "--recipes",
            str(tmp_path / "recipes.yaml"),
            "--only",
            "nope",
            "--dir",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=REPO,
    )
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: --only: unknown recipe(s) nope; {tmp_path / 'recipes.yaml'} has ref, fast_lr"
    ]
    assert not (tmp_path / "runs").exists()


def same_value(composed, written: str) -> bool:
    """A composed config value equals what the override wrote (6e-3 is 0.006; true is True)."""
    try:
        return float(composed) == float(written)
    except (TypeError, ValueError):
        return str(composed).lower() == written.lower()


def test_the_shipped_recipes_compose():
    """Every recipe of lab/configs/speedrun/recipes.yaml composes onto train.py's schema (a typo fails here,
    not after an hour of speedrun)."""
    spec = S.load_spec(REPO / "lab" / "configs" / "speedrun" / "recipes.yaml")
    for name, overrides in spec.recipes.items():
        cfg = compose([*ALWAYS, *spec.train_overrides, *overrides])
        for key, value in (o.split("=", 1) for o in overrides if "." in o.split("=", 1)[0]):
            node = cfg
            for part in key.split("."):
                node = getattr(node, part)
            assert same_value(node, value), (name, key, node)  # reaches the run


def test_the_speedruns_winner_is_a_preset_and_the_default_is_a_llama_stack():
    """The speedrun's fastest recipe (its reference, the 1-layer winner) is what `experiment=speedrun_cpu`
    trains — a named preset, no longer the default; `python train.py` trains a 4+ layer stack instead, and
    the presets whose published numbers are AdamW's (smoke runs, ablation studies) keep it."""

    def trained(*overrides):  # what a run trains (not its names and paths: a sweep dir holds the time)
        cfg = compose([*ALWAYS, *overrides])
        return cfg.model, cfg.data, cfg.optim, cfg.trainer, cfg.seed

    spec = S.load_spec(REPO / "lab" / "configs" / "speedrun" / "recipes.yaml")
    assert spec.reference == "muon_wu25_lr6e-3_layers1"
    winner = [*spec.train_overrides, *spec.recipes[spec.reference]]
    assert trained("experiment=speedrun_cpu") == trained(*winner)
    assert trained() != trained(*winner) and compose(ALWAYS).model.n_layers >= 4
    for preset in ("debug=tiny", "experiment=ablation_protocol", "experiment=ablation_norm_mlp"):
        assert trained(preset) == trained(preset, "optim=adamw"), preset
