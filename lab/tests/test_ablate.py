"""lab/ablate.py end to end on a tiny model: 2 variants × 3 LRs (one diverging) on the LR
seed, then 2 measuring seeds at each variant's own LR and the reference's, in one command; an LR at the grid's
edge extending the sweep; a resume that re-runs nothing finished, no seeds added after a look, Ctrl-C and
resume, and bad input.
The protocol runs in-process (main()) where no signal is sent, saving an interpreter start, and as a
process forked from the preloaded server where one is; its train.py multiruns are processes either way."""

import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from matplotlib import image

import analysis.plots
import lab.ablation.report
import lab.launcher
from lab.ablate import main
from lab.ablation.registration import MANIFEST
from tests import forked
from tests.train_helpers import read_metrics
from training.checkpoint import JOB_STATUS as STATUS_FILE
from training.program import exit_status

pytestmark = pytest.mark.serial  # trains: one at a time under make test's two workers (tests/fixtures.py)


@pytest.fixture(scope="module")
def forking():
    """In-process protocols fork their train.py multiruns from the preloaded server (tests/forked.py)."""

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lab.launcher.subprocess, "Popen", forked.popen_forking_train_py(subprocess.Popen))
        yield


PROTOCOL = {
    "reference": "ref",
    "variants": {"ref": [], "gelu": ["model.mlp=gelu"]},
    "lr_grid": [1e-3, 1e-2, 1e30],  # 1e30 diverges at the first step, in every variant
    "seeds": [0, 1],
    "stage1_seed": 100,
    "lr_extensions": 0,
    "primary": ["gelu"],
}
TINY = {
    "debug": "tiny",
    "trainer.precision": "fp32",
    "logger": "none",
    "trainer.max_steps": 6,
    "trainer.eval_interval": 3,
    "trainer.ckpt_interval": 3,
    "trainer.log_interval": 1,
    "trainer.num_threads": 1,
    "trainer.peak_tflops": 1,
    "trainer.sample_tokens": 0,
}


def tiny(**changes) -> list:
    """train.py overrides for seconds-long runs (keys with dots spelled with __)."""
    return [f"{k}={v}" for k, v in {**TINY, **{k.replace("__", "."): v for k, v in changes.items()}}.items()]


def ablate_process(tmp_path, *args) -> forked.ForkedRun:
    """`python -m lab.ablate <args>` as a real process (its own pid and signal handlers), forked from the
    preloaded server; the train.py it launches is a fresh interpreter, as a user's would be."""
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}
    return forked.ForkedRun(["-m", "lab.ablate", *map(str, args)], env, tmp_path)


@pytest.fixture(scope="module")
def cache_dir(tiny_data_cache):
    return tiny_data_cache  # debug=tiny's data, prepared once per session (tests/fixtures.py)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache_dir, forking):
    """The whole protocol, once: (protocol dir, what it printed)."""
    root = tmp_path_factory.mktemp("ablate")
    (root / "protocol.yaml").write_text(yaml.safe_dump(PROTOCOL))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(
            [
                "--protocol",
                str(root / "protocol.yaml"),
                "--dir",
                str(root / "p"),
                "--probe-steps",
                "2",
                *tiny(),
                f"data.cache_dir={cache_dir}",
                "hydra/launcher=basic",
            ]
        )  # a launcher, passed on
    assert status == 0, out.getvalue()[-3000:] + err.getvalue()[-3000:]
    return root / "p", out.getvalue()


def configs(runs_dir) -> dict:
    return {
        str(p.parent.relative_to(runs_dir)): yaml.safe_load(p.read_text())
        for p in runs_dir.rglob("config.yaml")
        if p.parent.name.startswith("lr")
    }


def final_bpb(run_dir) -> float:
    return [r for r in read_metrics(run_dir) if r["kind"] == "eval"][-1]["val_bpb"]


def chosen_lrs(protocol) -> dict:
    return yaml.safe_load((protocol / MANIFEST).read_text())["chosen_lr"]["base"]


def test_one_command_runs_both_stages_at_each_variants_best_lr_and_the_references(finished):
    protocol, out = finished
    assert out.index("per run") < out.index("MDE") < out.index("==> stage1") < out.index("==> stage2")  # cost first
    runs = protocol / "runs" / "base"
    chosen = chosen_lrs(protocol)
    for variant in ("ref", "gelu"):
        sweep = {lr: final_bpb(runs / variant / f"lr{lr:g}_seed100") for lr in (1e-3, 1e-2)}
        best = min(sweep, key=sweep.get)  # the chosen LR is the stage-1 argmin over the finite runs
        assert chosen[variant] == best
        status = yaml.safe_load((runs / variant / "lr1e+30_seed100" / STATUS_FILE).read_text())
        assert status["status"] == "FAILED" and "NonFiniteLoss" in status["error_types"]
        lrs = {best, chosen["ref"]}  # its own and the reference's (the same cells when they coincide)
        stage2 = sorted(p.name for p in (runs / variant).iterdir() if not p.name.endswith("seed100"))
        assert stage2 == sorted(f"lr{lr:g}_seed{s}" for lr in lrs for s in (0, 1))  # never the LR seed
    shared = 2 if chosen["gelu"] != chosen["ref"] else 0
    assert len(configs(protocol / "runs")) == 6 + 4 + shared  # 2 × 3 LRs on seed 100 (2 diverged), 2 × 2 seeds


def test_every_run_shares_the_protocols_wandb_group_with_stage_and_variant_tags(finished):
    protocol, _ = finished
    group = yaml.safe_load((protocol / MANIFEST).read_text())["id"]
    for name, config in configs(protocol / "runs").items():
        size, variant, cell = name.split("/")
        assert config["logger"]["group"] == group
        stage = "stage1" if cell.endswith("seed100") else "stage2"
        assert {stage, f"variant={variant}", f"size={size}"} <= set(config["logger"]["tags"])
        assert (config["model"]["mlp"] == "gelu") == (variant == "gelu")
        assert config["optim"]["min_lr"] == pytest.approx(0.1 * config["optim"]["lr"])


def test_manifest_records_the_plan_the_cost_the_look_and_every_cell(finished):
    protocol, _ = finished
    m = yaml.safe_load((protocol / MANIFEST).read_text())
    assert m["spec"]["variants"] == PROTOCOL["variants"] and m["spec"]["lr_grid"] == PROTOCOL["lr_grid"]
    assert m["spec"]["seeds"] == [0, 1] and "trainer.max_steps=6" in m["spec"]["train_overrides"]
    assert (m["spec"]["primary"], m["spec"]["secondary"]) == (["gelu"], [])  # ref vs gelu only: no secondary
    assert m["launcher_overrides"] == ["hydra/launcher=basic"]  # kept apart: not part of what is trained
    assert m["models"]["base"]["gelu"]["mlp"] < m["models"]["base"]["ref"]["mlp"]  # 4·64 = 256 vs 176 × 3
    assert m["cost"]["before stage1"]["source"] == "a 2-step timing run of each size"
    before = m["cost"]["before stage1"]["base"]
    assert (before["stage1_runs"], before["stage2_runs"]) == (6, 2 + 2 * 2)  # gelu counted at two LRs until known
    assert m["cost"]["before stage2"]["source"] == "the runs finished here" and m["wall_s"]["stage1"] > 0
    states = {name: cell["state"] for name, cell in m["cells"].items()}
    assert sorted(states.values()).count("diverged") == 2 and len(states) == len(configs(protocol / "runs"))
    assert [look["seeds"] for look in m["looks"]] == [{"stage2": [0, 1]}]


def test_report_has_the_verdicts_tables_figures_and_data(finished):
    protocol, out = finished
    report = protocol / "report"
    text = (report / "results.md").read_text()
    assert text in out
    assert "diverged" in text.split("## base")[0] and "## Verdicts on the primary contrasts" in text
    contrasts = [line for line in text.splitlines() if line.startswith("| gelu vs ref | base |")]
    assert len(contrasts) == 2 and all(line.count("[") == 1 for line in contrasts)  # own LR, shared LR
    assert "SwiGLU vs GELU at matched parameters" in text  # gelu is the primary: the literature paragraph
    for name in ("lr_sweep", "forest", "val_curves_base", "activation_rms_base"):
        assert image.imread(report / f"{name}.png").ndim == 3
    assert len(list(csv.DictReader(open(report / "per_seed.csv")))) == len(configs(protocol / "runs"))


def test_a_best_lr_at_the_grids_edge_runs_one_more_point_beyond_it(tmp_path, cache_dir, capsys, forking):
    """6 steps of the tiny model: 1e-3 learns more than 1e-4 (the grid's top), so 1e-2 is tried too."""
    (tmp_path / "edge.yaml").write_text(
        yaml.safe_dump(
            {"reference": "ref", "variants": {"ref": []}, "lr_grid": [1e-4, 1e-3], "seeds": [0], "lr_extensions": 1}
        )
    )
    status = main(
        [
            "--protocol",
            str(tmp_path / "edge.yaml"),
            "--dir",
            str(tmp_path / "p"),
            "--probe-steps",
            "0",
            *tiny(),
            f"data.cache_dir={cache_dir}",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out[-3000:]
    assert "stage1: best LR at the grid's edge: one more point beyond it for base/ref (0.01)" in out
    assert sorted(
        p.name for p in (tmp_path / "p" / "runs" / "base" / "ref").iterdir() if p.name.endswith("seed100")
    ) == ["lr0.0001_seed100", "lr0.001_seed100", "lr0.01_seed100"]
    assert "lr 0.01 |" in (tmp_path / "p" / "report" / "results.md").read_text()


def test_transfer_from_sweeps_lrs_at_the_narrow_width_only_and_trains_every_width_under_mup(
    tmp_path, cache_dir, capsys, forking
):
    """--transfer-from w32: stage 1 at w32 only; w64 measured at w32's chosen LRs; every run under μP, base 32;
    the cost printed first says what the skipped sweep would have cost."""
    (tmp_path / "t.yaml").write_text(
        yaml.safe_dump(
            {
                **PROTOCOL,
                "lr_grid": [1e-3, 1e-2],
                "seeds": [0],
                "sizes": {"w32": ["model.hidden_size=32"], "w64": ["model.hidden_size=64"]},
            }
        )
    )
    status = main(
        [
            "--protocol",
            str(tmp_path / "t.yaml"),
            "--dir",
            str(tmp_path / "p"),
            "--probe-steps",
            "2",
            "--transfer-from",
            "w32",
            *tiny(),
            f"data.cache_dir={cache_dir}",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out[-3000:]
    saving = re.search(
        r"transfer_from w32 \(μP\): stage 1 sweeps LRs only there and every size reuses them; 4 grid "
        r"runs at w64 are not trained, saving (\d+\.\d) min",
        out,
    )
    assert saving and out.index(saving.group(0)) < out.index("==> stage1")
    runs, manifest = tmp_path / "p" / "runs", yaml.safe_load((tmp_path / "p" / MANIFEST).read_text())
    assert not list((runs / "w64").rglob("*_seed100")) and len(list((runs / "w32").rglob("*_seed100/config.yaml"))) == 4
    assert manifest["chosen_lr"]["w64"] == manifest["chosen_lr"]["w32"]
    assert manifest["cost"]["before stage1"]["transfer_saves"]["runs"] == 4
    for name, config in configs(runs).items():
        assert (config["model"]["parametrization"], config["model"]["mup_base_width"]) == ("mup", 32), name
        size, variant, _ = name.split("/")
        if name.endswith("seed0"):
            assert config["optim"]["lr"] in {manifest["chosen_lr"]["w32"][variant], manifest["chosen_lr"]["w32"]["ref"]}
    assert "reuse the LRs chosen at **w32**" in (tmp_path / "p" / "report" / "results.md").read_text()


def test_the_pre_registration_is_recorded_before_training_and_a_hand_edit_is_refused(finished, tmp_path, capsys):
    """protocol.yaml holds the pre-registered part's SHA-256 from before the first cell; the report prints it; a
    margin loosened by hand in protocol.yaml afterwards stops both a report and a resume, in one line."""
    protocol = tmp_path / "p"
    shutil.copytree(finished[0], protocol)
    (record,) = yaml.safe_load((protocol / MANIFEST).read_text())["registrations"]
    assert f"pre-registered: SHA-256 {record['sha256']}" in finished[1]  # said when the protocol started
    results = (protocol / "report" / "results.md").read_text()
    assert f"Pre-registered {record['registered']}, SHA-256 {record['sha256']}." in results
    assert re.search(r"; margin [+-]\d\.\d{3} bpb over the runner-up\)", results), results  # each choice's margin
    stored = yaml.safe_load((protocol / MANIFEST).read_text())
    stored["spec"]["equivalence_margin"] = 0.5
    (protocol / MANIFEST).write_text(yaml.safe_dump(stored, sort_keys=False))
    for args in (["--report-only"], ["--dry-run"]):
        status = exit_status(main, ["--dir", str(protocol), *args])
        err = capsys.readouterr().err
        assert (
            status == 1
            and err.count("\n") == 1
            and f"the spec's equivalence_margin no longer match(es) its pre-registration {record['sha256'][:12]}" in err
        ), err
    # A consistent forgery — the edited spec registered afresh — is caught by the runs: each names its hash.
    from lab.ablation import registration
    from lab.ablation.registration import spec_of

    (tag,) = {yaml.safe_load(p.read_text())["logger"]["tags"][-1] for p in protocol.glob("runs/*/*/*/config.yaml")}
    assert tag == f"registration={record['sha256'][:12]}"
    stored.pop("registrations")
    registration.register(stored, spec_of(stored), "forged", record["preregistered"]["configs"])
    (protocol / MANIFEST).write_text(yaml.safe_dump(stored, sort_keys=False))
    status = exit_status(main, ["--dir", str(protocol), "--report-only"])
    err = capsys.readouterr().err
    assert (
        status == 1
        and f"ran under pre-registration {record['sha256'][:12]}, which this manifest does not record" in err
    ), err


def test_a_config_that_composes_otherwise_than_at_registration_is_refused(finished, tmp_path, capsys):
    """The record holds each cell's composed config: one that now composes otherwise (a preset edited since, here
    simulated by the record's digest) stops a report and a resume in one line naming the cell."""
    from lab.ablation.registration import fingerprint

    protocol = tmp_path / "p"
    shutil.copytree(finished[0], protocol)
    stored = yaml.safe_load((protocol / MANIFEST).read_text())
    (record,) = stored["registrations"]
    cell = sorted(record["preregistered"]["configs"])[0]
    assert len(record["preregistered"]["analysis"]) == 64 and len(record["preregistered"]["configs"][cell]) == 64
    record["preregistered"]["configs"][cell] = "0" * 64
    record["sha256"] = fingerprint(record["preregistered"])  # a record consistent with itself
    (protocol / MANIFEST).write_text(yaml.safe_dump(stored, sort_keys=False))
    for args in (["--report-only"], ["--dry-run"]):
        status = exit_status(main, ["--dir", str(protocol), *args])
        err = capsys.readouterr().err
        assert status == 1 and err.count("\n") == 1 and f"the composed config of {cell} (its preset" in err, err


def test_the_report_rederives_its_files_from_the_runs_and_refuses_an_edited_one(finished, tmp_path, capsys, unrendered):
    """The same runs must give the same per_seed.csv, contrasts.csv and results.json byte for byte: an edit made
    consistently across all three is refused, naming the first; a copy without its runs has nothing to derive from."""
    protocol = tmp_path / "p"
    shutil.copytree(finished[0], protocol)
    report = protocol / "report"
    assert json.loads((report / "results.json").read_text())["preregistration"].startswith("Pre-registered ")
    assert exit_status(main, ["--dir", str(protocol), "--report-only"]) == 0  # unchanged: the same files again
    capsys.readouterr()
    for name in ("per_seed.csv", "contrasts.csv", "results.json"):
        text = (report / name).read_text()
        (report / name).write_text(text.replace("0.", "0.0", 1))  # one digit, in every file
    status = exit_status(main, ["--dir", str(protocol), "--report-only"])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "per_seed.csv differs from what its cells' runs give" in err, err
    shutil.rmtree(protocol / "runs")
    status = exit_status(main, ["--dir", str(protocol), "--report-only"])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "a copy without its runs?" in err, err


@pytest.fixture
def unrendered(monkeypatch):
    """The report's figures drawn but written as a bare PNG signature, not rendered (~1 s each): for the tests that
    read its text files; test_report_has_the_verdicts_tables_figures_and_data reads the rendered ones."""

    def save(fig, path):
        Path(path).write_bytes(b"\x89PNG\r\n\x1a\n")

    monkeypatch.setattr(analysis.plots, "save", save)
    monkeypatch.setattr(lab.ablation.report, "save", save)


def files(root) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_edited_file_in_a_cells_run_directory_is_refused_naming_it_and_a_refusal_writes_nothing(
    finished, tmp_path, capsys, unrendered
):
    """The manifest holds every done cell's files' digests: a result edited by hand is refused in one line naming
    the file, by a report and a resume alike, instead of being derived from; --report-only that refuses (here, or
    an edited report file) leaves every file as it was."""
    protocol = tmp_path / "p"
    shutil.copytree(finished[0], protocol)
    assert exit_status(main, ["--dir", str(protocol), "--report-only"]) == 0  # as recorded: accepted
    capsys.readouterr()
    report = protocol / "report" / "per_seed.csv"
    report.write_text(report.read_text().replace("0.", "0.0", 1))
    before = files(protocol)
    assert exit_status(main, ["--dir", str(protocol), "--report-only"]) == 1
    assert "per_seed.csv differs from what its cells' runs give" in capsys.readouterr().err
    assert files(protocol) == before  # protocol.yaml's command and time untouched
    shutil.copy(finished[0] / "report" / "per_seed.csv", report)
    cells = yaml.safe_load((protocol / MANIFEST).read_text())["cells"]
    name = next(n for n, e in cells.items() if e["state"] == "finished")
    assert set(cells[name]["files"]) >= {"metrics.jsonl", "config.yaml", "job_status.yaml"}
    metrics = protocol / "runs" / name / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows[-1]["val_bpb"] = rows[-1]["val_bpb"] - 0.5 if "val_bpb" in rows[-1] else 0.1  # a better result, by hand
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = files(protocol)
    for args in (["--report-only"], ["--probe-steps", "0"]):
        status = exit_status(main, ["--dir", str(protocol), *args])
        err = capsys.readouterr().err
        assert status == 1 and err.count("\n") == 1 and f"{metrics} changed since" in err, err
        assert files(protocol) == before


def test_seeds_are_not_added_after_a_look_unless_sequential(finished, tmp_path, capsys):
    protocol = tmp_path / "p"
    shutil.copytree(finished[0], protocol)
    status = exit_status(main, ["--dir", str(protocol), "--seeds", "3", "--dry-run", "--probe-steps", "0"])
    err = capsys.readouterr().err
    assert status == 1 and "stage2: seeds 2 would be added after a look at seeds 0, 1" in err
    assert main(["--dir", str(protocol), "--seeds", "3", "--dry-run", "--probe-steps", "0", "--sequential"]) == 0
    assert "stage 2: seeds 0, 1, 2 at each variant's own best LR" in capsys.readouterr().out  # seed 2 planned


def test_a_pilot_protocol_gives_the_planning_spread(finished, tmp_path, capsys):
    from lab.ablation.runner import spread_from

    sd, dof, _ = spread_from(finished[0])
    status = main(
        [
            "--protocol",
            str(finished[0].parent / "protocol.yaml"),
            "--dir",
            str(tmp_path / "p"),
            "--spread-from",
            str(finished[0]),
            "--dry-run",
            "--probe-steps",
            "0",
            *tiny(),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0 and f"sd = {sd:.4f} bpb" in out and f"({dof} dof)" in out and dof == 1


def test_resume_reruns_nothing_finished(finished, tmp_path, capsys, forking):
    """Half-finish a copy: one stage-2 cell deleted, one cut back to its step-3 checkpoint, one
    failed for a non-divergence reason. The rerun (just --dir) does exactly those three."""
    protocol = tmp_path / "p"
    shutil.copytree(finished[0], protocol)
    runs = protocol / "runs" / "base"
    chosen = chosen_lrs(protocol)
    deleted, cut = (runs / v / f"lr{chosen[v]:g}_seed{s}" for v, s in (("gelu", 1), ("ref", 1)))
    failed = runs / "ref" / f"lr{({1e-3, 1e-2} - {chosen['ref']}).pop():g}_seed100"  # a stage-1 run
    shutil.rmtree(deleted)
    shutil.rmtree(cut / "checkpoints" / "step_0000006")
    shutil.rmtree(cut / "checkpoints" / "best" / "step_0000006", ignore_errors=True)  # a run cut at step 3 has none
    rows = [r for r in read_metrics(cut) if r["step"] <= 3]
    (cut / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (cut / STATUS_FILE).unlink()
    (failed / STATUS_FILE).write_text(
        yaml.safe_dump({"status": "FAILED", "error": "disk full", "error_types": ["JobFailed", "WriteError"]})
    )
    stored = yaml.safe_load((protocol / MANIFEST).read_text())
    for run in (cut, failed):  # interrupted before the manifest recorded them done (an edit after that is refused)
        stored["cells"].pop(run.relative_to(protocol / "runs").as_posix())
    (protocol / MANIFEST).write_text(yaml.safe_dump(stored, sort_keys=False))
    redone = tuple(str(p) + os.sep for p in (deleted, cut, failed))
    untouched = {
        p: (p.stat().st_mtime_ns, p.read_bytes())
        for p in runs.rglob("*")
        if p.is_file() and not str(p).startswith(redone)
    }
    assert (
        len([p for p in untouched if p.name == "metrics.jsonl"]) == len(list(runs.rglob("metrics.jsonl"))) - 2
    )  # cut, failed
    status = main(["--dir", str(protocol)])
    out = capsys.readouterr().out
    assert status == 0, out[-3000:]
    assert "==> stage1: 1 of 6 runs to do" in out  # the failed cell is a stage-1 run
    assert re.search(r"==> stage2: 2 of \d runs to do \(1 resumed\)", out)
    assert "moved to" in out and (protocol / "discarded").is_dir()
    for path, (mtime, content) in untouched.items():
        assert path.stat().st_mtime_ns == mtime and path.read_bytes() == content, path
    for run in (deleted, cut, failed):
        assert [r for r in read_metrics(run) if r["kind"] == "eval"][-1]["step"] == 6
    assert [r for r in read_metrics(cut) if r["step"] <= 3] == rows  # continued, not restarted


def test_ctrl_c_stops_with_a_checkpoint_and_a_rerun_finishes(tmp_path, cache_dir, capsys, forking):
    """One variant at one LR: stage 1's run, then stage 2's. SIGINT to the protocol during stage 1 reaches
    train.py once, which checkpoints; the rerun resumes that checkpoint to the end, then runs stage 2."""
    (tmp_path / "one.yaml").write_text(
        yaml.safe_dump({"reference": "ref", "variants": {"ref": []}, "lr_grid": [1e-3], "seeds": [0]})
    )
    args = [
        "--protocol",
        tmp_path / "one.yaml",
        "--dir",
        tmp_path / "p",
        "--probe-steps",
        "0",
        *tiny(trainer__max_steps=150, trainer__eval_interval=150, trainer__ckpt_interval=150, trainer__log_interval=10),
        f"data.cache_dir={cache_dir}",
    ]
    proc = ablate_process(tmp_path, *args)
    metrics = tmp_path / "p" / "runs" / "base" / "ref" / "lr0.001_seed100" / "metrics.jsonl"  # stage 1's run
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "SIGINT: checkpoint saved" in out and "continue with: python -m lab.ablate --dir" in out
    status = main(["--dir", str(tmp_path / "p"), "--probe-steps", "0"])
    out = capsys.readouterr().out
    assert status == 0 and "(1 resumed)" in out, out[-3000:]
    assert [r for r in read_metrics(metrics.parent) if r["kind"] == "eval"][-1]["step"] == 150


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variants", "ref,nope"], "--variants: unknown nope"),
        (["--variant", "bad model.norm=nosuchnorm"], "variant bad does not compose"),
        (["--lrs", "1e-3,fast"], "--lrs '1e-3,fast' is not a comma-separated list"),
        (["--reference", "gelu2"], "reference 'gelu2' is not among the variants"),
        (["--sizes", "model.hidden_size=32,64 model.n_heads=2,4", "--variant", "relu2 model.mlp=relu2"], None),
        (["model.mlp=gelu"], "variant gelu sets model.mlp, which the command line also sets"),
        (["--stage1-seed", "1"], "stage1_seed=1 is also a measuring seed"),
        (["--seeds", "many"], "--seeds 'many' is not a number of seeds or 'auto'"),
        (["--seeds", "auto"], "seeds: auto needs planning_sd"),
        (["--spread-from", "/nonexistent/protocol.yaml"], "--spread-from /nonexistent/protocol.yaml: not a protocol"),
    ],
)
def test_bad_input_is_a_one_line_error_before_anything_trains(tmp_path, capsys, args, message):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(PROTOCOL))
    status = exit_status(
        main,
        [
            "--protocol",
            str(tmp_path / "p.yaml"),
            "--dir",
            str(tmp_path / "p"),
            "--dry-run",
            "--probe-steps",
            "0",
            *tiny(),
            *args,
        ],
    )
    out, err = capsys.readouterr()
    if message is None:  # fine: the plan and its cost are printed, and nothing trains
        assert status == 0 and "hidden_size64_n_heads4" in out and "× 3 variants" in out  # relu2 added
        assert not (tmp_path / "p").exists()  # a dry run writes nothing
        return
    assert status == 1 and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "p" / "runs").exists()


def test_a_subset_of_variants_keeps_their_families_and_sizes():
    from lab.ablate import build_spec, parse_args

    spec = build_spec(
        parse_args(["--variants", "rmsnorm_swiglu,layernorm,no_norm,relu2", "--variant", "relu2 model.mlp=relu2"])
    )
    assert (spec.primary, spec.secondary) == (["layernorm"], ["no_norm", "relu2"])  # an added variant: secondary
    assert spec.variant_sizes == {"no_norm": ["d2"]} and spec.family_tests("primary") == [
        ("d2", "layernorm"),
        ("d6", "layernorm"),
    ]


def test_a_changed_setup_is_not_resumed_into_the_same_directory(finished, capsys):
    status = exit_status(main, ["--dir", str(finished[0]), "--report-only", "trainer.max_steps=7"])
    assert status == 1 and "was started with train.py overrides" in capsys.readouterr().err


def test_a_dry_run_prices_the_plan_from_the_protocols_stored_throughput(tmp_path, capsys):
    """Before anything has run, a dry run's cost comes from planning_tokens_per_s (a timing run on one machine,
    named in the output): per run, the budget's tokens at that rate plus its evals. An override that changes
    what a step costs leaves the cost unknown rather than wrong; nothing is written either way."""
    from lab import sweep
    from lab.ablate import typed_config, validate
    from lab.ablation.protocol import Spec

    spec = {**PROTOCOL, "planning_tokens_per_s": {"base": 1000.0}, "planning_tokens_per_s_source": "a test machine"}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec))
    args = ["--protocol", str(tmp_path / "p.yaml"), "--dir", str(tmp_path / "p"), "--dry-run"]
    assert main([*args, "trainer.max_steps=50"]) == 0
    out = capsys.readouterr().out
    budget = validate(Spec(**spec, train_overrides=["trainer.max_steps=50"]), typed_config)[1]["base"]
    seconds = budget.max_steps * budget.tokens_per_step / 1000 + budget.evals * budget.eval_tokens / 3 / 1000 + 3
    assert sweep.seconds_at(budget, 1000.0) == pytest.approx(seconds)
    assert re.search(rf"^base +[\d.]+M +{seconds:.0f} s ", out, re.M), out
    assert "per-run time from the protocol's stored throughput, a test machine (another machine may be" in out
    assert main([*args, "trainer.max_steps=50", "trainer.micro_batch_size=2"]) == 0  # the stored rate does not hold
    assert "per-run time from nothing yet" in capsys.readouterr().out
    assert not (tmp_path / "p").exists()
    with pytest.raises(ValueError, match="planning_tokens_per_s: base: -1.0 must be > 0"):
        Spec(**{**spec, "planning_tokens_per_s": {"base": -1}})


def test_a_dry_run_trains_nothing_unless_told_to_time(tmp_path, capsys):
    """`--dry-run` once trained timing runs for minutes and left their directories; now it prints the plan and
    trains nothing — `--probe-steps N` with it asks for the timing run (docs/ablation/README.md's example)."""
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(PROTOCOL))
    assert main(["--protocol", str(tmp_path / "p.yaml"), "--dir", str(tmp_path / "p"), "--dry-run", *tiny()]) == 0
    assert (
        "per-run time from nothing yet (no timing run: --probe-steps N times each size first)"
        in capsys.readouterr().out
    )
    assert not (tmp_path / "p").exists()  # not even the plan: a directory left behind is a protocol begun
