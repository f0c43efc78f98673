"""train.py end to end on the tiny debug config: learning, outputs, pruning, bad input (faults: test_faults.py)."""

import json
import sys

import pytest
import yaml
from safetensors.torch import load_file

from data import windows_per_epoch
from tests.train_helpers import REPO, launch, read_metrics, run_dirs, run_faulty, run_train, tiny_args

pytestmark = pytest.mark.serial  # trains: one at a time under make test's two workers (tests/fixtures.py)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, tiny_data_cache):
    """A data cache of this module's own (its runs add entries), starting with the session's prepared one."""
    import shutil

    return shutil.copytree(tiny_data_cache, tmp_path_factory.mktemp("data_cache"), dirs_exist_ok=True)


def test_tiny_run_learns_and_writes_outputs(tmp_path, cache_dir):
    proc = run_train(
        tmp_path,
        "trainer.max_steps=40",
        "trainer.eval_interval=20",
        "trainer.epoch_warning=0.002",
        "trainer.peak_tflops=null",  # MFU against this machine's measured peak: below 1
        cache_dir=cache_dir,
    )
    (run,) = run_dirs(tmp_path)
    rows = read_metrics(run)
    train_rows = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert train_rows[-1]["loss"] < train_rows[0]["loss"] - 0.5
    assert [e["step"] for e in evals] == [20, 40]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    for key in ("val_ppl", "val_bpb", "rms_residual"):
        assert key in evals[-1]
    assert len(evals[-1]["rms_residual"]) == len(evals[-1]["rms_mlp_in"]) == 2  # one value per layer
    assert all(0 < r["mfu"] < 1 and r["tokens_per_s"] > 0 for r in train_rows)
    ckpt = run / "checkpoints" / "step_0000040"
    for name in (
        "model.safetensors",
        "model_config.json",
        "tokenizer.json",
        "config.yaml",
        "optimizer.pt",
        "rng.pt",
        "state.json",
    ):
        assert (ckpt / name).exists(), name
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in load_file(ckpt / "model.safetensors"))
    assert json.loads((ckpt / "state.json").read_text())["step"] == 40
    # The summary tells the user where things are and how to generate.
    assert "bits per byte" in proc.stdout and "scripts/generate.py" in proc.stdout
    assert "intermediate_size 176, 2 layers," in proc.stdout  # tiny: int(8·64/3) = 170, rounded up to 16s
    # Epochs are logged, and passing trainer.epoch_warning warns exactly once.
    epochs = [r["epochs"] for r in train_rows]
    windows = windows_per_epoch(rows_train_tokens(proc), 64)  # the default data.sampling=epochs: true passes
    assert epochs == sorted(epochs) and epochs[-1] == pytest.approx(40 * 4 / windows)
    assert proc.stdout.count(" epochs over the ") == 1 and "epoch-equivalents" not in proc.stdout
    assert all(r["peak_memory_gb"] > 0 for r in train_rows)
    # The run directory holds what the run wrote, nothing empty: Hydra's own train.log is off (minillama prints).
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == [
        "checkpoints",
        "config.yaml",
        "metrics.jsonl",
    ]


def rows_train_tokens(proc) -> int:
    """The training split's token count, from the run header ("data: shakespeare: N train / …")."""
    line = next(x for x in proc.stdout.splitlines() if x.startswith("data: shakespeare:"))
    return int(line.split(": ")[2].split(" train")[0].replace(",", ""))


def test_best_checkpoint_keeps_the_lowest_validation_bpb(tmp_path, cache_dir):
    # Scripted validation results (3.0, 2.5, 2.8 bpb): the best is the middle eval, not the last.
    proc = run_faulty(
        tmp_path,
        {"val_bpb": [3.0, 2.5, 2.8]},
        "trainer.max_steps=6",
        "trainer.eval_interval=2",
        "trainer.ckpt_interval=6",
        cache_dir=cache_dir,
    )
    (run,) = run_dirs(tmp_path)
    (best,) = (run / "checkpoints" / "best").iterdir()
    assert best.name == "step_0000004"
    assert json.loads((best / "state.json").read_text())["best_val_bpb"] == 2.5
    assert f"best val bits per byte 2.5000 at step 4: {run}/checkpoints/best" in proc.stdout
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_0000006"]  # best is apart


def test_keep_last_prunes_old_checkpoints(tmp_path, cache_dir):
    run_train(
        tmp_path,
        "trainer.max_steps=8",
        "trainer.ckpt_interval=2",
        "trainer.keep_last=2",
        "trainer.eval_interval=8",
        cache_dir=cache_dir,
    )
    (run,) = run_dirs(tmp_path)
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_0000006", "step_0000008"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.n_heads=5", "model.hidden_size=64 is not divisible by model.n_heads=5"),
        ("model.norm=batchnorm", "model.norm='batchnorm' is unknown"),
        ("trainer.seq_len=128", "exceeds model.max_seq_len=64"),
        ("trainer.device=tpu", "trainer.device='tpu'"),
        ("resume=/nonexistent/ckpt", "does not exist"),
        ("trainer.precision=fp8", "trainer.precision='fp8' is unknown"),
        ("seed=-1", "seed=-1 must be an integer from 0 to 2**63 - 1"),
    ],
)
def test_bad_overrides_fail_with_one_line(tmp_path, cache_dir, override, message):
    proc = run_train(tmp_path, override, cache_dir=cache_dir, check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and message in last, proc.stderr
    assert "Traceback" not in proc.stderr


def test_typo_key_fails_at_composition(tmp_path, cache_dir):
    proc = run_train(tmp_path, "model.hiden_size=3", cache_dir=cache_dir, check=False)
    assert proc.returncode == 1
    assert "hiden_size" in proc.stderr and "Traceback" not in proc.stderr


def test_corrupt_and_mismatched_checkpoints_are_refused(tmp_path, cache_dir):
    run_train(tmp_path, "trainer.max_steps=4", "trainer.eval_interval=4", cache_dir=cache_dir)
    (run,) = run_dirs(tmp_path)
    ckpt = run / "checkpoints" / "step_0000004"
    finished = run_train(tmp_path, f"resume={run}", cache_dir=cache_dir, check=False)
    assert (
        finished.returncode == 1
        and "is at step 4, already at trainer.max_steps=4; pass a larger" in finished.stderr.splitlines()[-1]
    )
    past = run_train(tmp_path, f"resume={ckpt}", "trainer.max_steps=2", cache_dir=cache_dir, check=False)
    assert past.returncode == 1 and "is at step 4, past trainer.max_steps=2; pass a larger" in past.stderr
    assert "Traceback" not in past.stderr
    mismatch = run_train(tmp_path, f"resume={ckpt}", "model.hidden_size=32", cache_dir=cache_dir, check=False)
    assert mismatch.returncode == 1 and "keeps the checkpoint's architecture" in mismatch.stderr.splitlines()[-1]
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    corrupt = run_train(tmp_path, f"resume={ckpt}", "trainer.max_steps=6", cache_dir=cache_dir, check=False)
    assert corrupt.returncode == 1 and "corrupt" in corrupt.stderr.splitlines()[-1]


def test_new_run_never_overwrites_an_existing_run(tmp_path, cache_dir):
    run_train(tmp_path, "trainer.max_steps=2", "trainer.eval_interval=2", cache_dir=cache_dir)
    (run,) = run_dirs(tmp_path)
    before = (run / "metrics.jsonl").read_text()
    proc = run_train(
        tmp_path, f"hydra.run.dir={run}", "trainer.max_steps=2", "trainer.eval_interval=2", cache_dir=cache_dir
    )
    assert f"using {run}-1" in proc.stderr  # a sibling, said out loud; resuming is resume=<dir>
    assert (run / "metrics.jsonl").read_text() == before
    assert (run.parent / f"{run.name}-1" / "checkpoints" / "step_0000002").is_dir()


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lr=0", "optim.lr=0.0 must be > 0"),
        ("optim.lr=-1e-3", "optim.lr=-0.001 must be > 0"),
        ("optim.min_lr=0.01", "optim.min_lr=0.01 must be between 0 and optim.lr=0.006"),  # Muon's default lr
        ("optim.warmup_steps=-1", "optim.warmup_steps=-1 must be >= 0"),
        ("optim.grad_clip=-1", "optim.grad_clip=-1.0 must be >= 0"),
        ("trainer.stop_at_step=0", "trainer.stop_at_step=0 must be > 0, or null"),
        ("trainer.max_steps=0", "trainer.max_steps=0 must be a positive integer"),
        ("trainer.keep_last=-1", "trainer.keep_last=-1 must be >= 0"),
        ("trainer.skip_nonfinite_steps=-2", "trainer.skip_nonfinite_steps=-2 must be >= 0"),
        ("trainer.eval_windows=some", "trainer.eval_windows='some' must be a positive number of windows or 'all'"),
        ("trainer.compile=maybe", "trainer.compile='maybe' is unknown"),
        ("data.sampling=sequential", "data.sampling='sequential' is unknown; choose one of random, epochs"),
    ],
)
def test_bad_values_fail_at_composition_naming_the_field(override, message):
    """resolve_config (the step before any data is prepared) turns them into one ValueError each."""
    from training.cli import resolve_config
    from training.program import compose

    cfg = compose([override])  # as @hydra.main hands it to main(): HydraConfig set, no hydra node
    with pytest.raises(ValueError) as error:
        resolve_config(cfg)
    assert message in str(error.value) and len(str(error.value).splitlines()) == 1


def test_a_failed_start_fails_before_data_and_leaves_no_run_directory(tmp_path, cache_dir):
    # The data path does not exist either: the config error must come first, before data preparation.
    proc = run_train(
        tmp_path, "optim.lr=0", "data=local", "data.path=/nonexistent/*.txt", cache_dir=cache_dir, check=False
    )
    assert (
        proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == "error: optim.lr=0.0 must be > 0 (e.g. 3e-3)"
    )
    assert "data:" not in proc.stdout + proc.stderr
    later = run_train(tmp_path, "data=local", "data.path=/nonexistent/*.txt", cache_dir=cache_dir, check=False)
    assert later.returncode == 1 and "matches no files" in later.stderr.strip().splitlines()[-1]
    assert run_dirs(tmp_path) == [] and not any((tmp_path / "outputs").glob("*/*")), "a failed start left a run dir"


def test_trainer_precision_bf16_trains_in_bf16_end_to_end(tmp_path, cache_dir):
    """`python train.py trainer.precision=bf16` computes in bf16: its loss curve is not the fp32 run's
    (a loop that forgot autocast gives the fp32 curve to the bit) yet stays close to it. Measured over
    these 20 steps on AMX and on emulated AVX2 / AVX512-BF16: the curves differ by 1e-3 to 3e-3 nats — on random
    windows, which the test keeps (the default epochs order's gap was 1.9e-4 on an AMD EPYC: another batch order)."""
    curves = {}
    for precision in ("fp32", "bf16"):
        proc = run_train(
            tmp_path / precision,
            f"trainer.precision={precision}",
            "trainer.log_interval=1",
            "data.sampling=random",
            cache_dir=cache_dir,
        )
        assert f"cpu, {precision} (trainer.precision)" in proc.stdout  # the header says what it runs
        (run,) = run_dirs(tmp_path / precision)
        curves[precision] = [r["loss"] for r in read_metrics(run) if r["kind"] == "train"]
    gap = max(abs(a - b) for a, b in zip(*curves.values()))
    assert len(curves["bf16"]) == 20 and 2e-4 < gap < 2e-2, gap


def test_the_summary_gives_the_peak_memory(tmp_path, cache_dir):
    proc = run_train(tmp_path, "trainer.max_steps=4", "trainer.eval_interval=4", cache_dir=cache_dir)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("peak memory "))
    gib = float(line.split()[2])
    assert 0.05 < gib < 16 and line.endswith("GiB (process max RSS)")  # a CPU process: torch alone is ~0.3 GiB


def test_a_resume_removes_half_written_checkpoints_and_refuses_a_contradicting_one(tmp_path, cache_dir):
    """train.py's start, as wired: a `.tmp` a kill left mid-save is removed (and said), and a checkpoint
    whose files disagree is refused in one line before anything trains from it."""
    run_train(tmp_path, "trainer.max_steps=8", "trainer.stop_at_step=4", "trainer.ckpt_interval=4", cache_dir=cache_dir)
    (run,) = run_dirs(tmp_path)
    stray = run / "checkpoints" / "step_0000006.tmp"
    stray.mkdir()
    (stray / "model.safetensors").write_bytes(b"half")
    proc = run_train(tmp_path, f"resume={run}", cache_dir=cache_dir)
    assert f"removed a half-written checkpoint: {stray}" in proc.stderr and not stray.exists()
    ckpt = run / "checkpoints" / "step_0000008"
    fields = json.loads((ckpt / "model_config.json").read_text())
    (ckpt / "model_config.json").write_text(json.dumps({**fields, "hidden_size": 128}))
    refused = run_train(tmp_path, f"resume={run}", "trainer.max_steps=12", cache_dir=cache_dir, check=False)
    assert refused.returncode == 1  # the manifest sees the edited file first…
    assert (
        refused.stderr.strip().splitlines()[-1].startswith(f"error: checkpoint {ckpt} is damaged: model_config.json ")
    )
    refused = run_train(
        tmp_path, f"resume={run}", "trainer.max_steps=12", "verify_checkpoint=false", cache_dir=cache_dir, check=False
    )
    assert refused.returncode == 1  # …and unverified, the files' consistency check refuses it
    assert refused.stderr.strip().splitlines()[-1].startswith(f"error: checkpoint {ckpt} contradicts itself: ")


@pytest.mark.parametrize("env_mode, outcome", [(None, "offline"), ("online", "error")])
def test_wandb_without_a_key_never_prompts_on_a_terminal(tmp_path, cache_dir, env_mode, outcome):
    """On a terminal (stdin a tty), with no API key: logger.wandb=auto logs offline, and WANDB_MODE=online
    in the environment is one `error:` line before anything starts — never wandb's login prompt."""
    import os
    import pty
    import subprocess

    from tests import forked
    from tests.train_helpers import tiny_args

    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE")}
    env.update(
        HOME=str(tmp_path),
        NETRC=str(tmp_path / "no-netrc"),
        HYDRA_FULL_ERROR="0",
        OMP_NUM_THREADS="1",
        WANDB_DIR=str(tmp_path),
        **({"WANDB_MODE": env_mode} if env_mode else {}),
    )
    _, terminal = pty.openpty()
    args = tiny_args(tmp_path, ["logger=wandb", "trainer.max_steps=2", "trainer.eval_interval=2"], cache_dir)
    # A real process forked from the preloaded server (tests/forked.py), its stdin the terminal.
    child = forked.ForkedRun([str(REPO / "train.py"), *args], env, REPO, stdin=os.ttyname(terminal))
    try:
        out, err = child.communicate(timeout=240)  # a login prompt would wait here
    finally:
        child.kill()
    proc = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    if outcome == "offline":
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "wandb: no API key configured, logging offline" in proc.stderr
        (run,) = run_dirs(tmp_path)
        assert list((run / "wandb").glob("offline-run-*"))
    else:
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines()[-1] == (
            "error: WANDB_MODE=online but no API key is configured; run `wandb login` or set WANDB_API_KEY, "
            "or use logger.wandb=offline"
        )
        assert run_dirs(tmp_path) == [], "a failed start left a run dir"


def test_a_resume_keeps_the_runs_bookkeeping(tmp_path, cache_dir):
    """Everything state.json carries besides weights, losses and RNG survives a resume: the best bpb and its
    step (a worse eval after the resume must not replace checkpoints/best), the skipped non-finite steps and
    the training time."""
    first = run_faulty(
        tmp_path,
        {"val_bpb": [3.0, 2.5], "nan_steps": [3]},
        "trainer.max_steps=6",
        "trainer.stop_at_step=4",
        "trainer.eval_interval=2",
        "trainer.ckpt_interval=2",
        "trainer.skip_nonfinite_steps=2",
        cache_dir=cache_dir,
    )
    assert "skipped 1 non-finite step(s)" in first.stdout
    (run,) = run_dirs(tmp_path)
    at_stop = json.loads((run / "checkpoints" / "step_0000004" / "state.json").read_text())
    assert (at_stop["best_val_bpb"], at_stop["best_step"], at_stop["skipped_steps"]) == (2.5, 4, 1)
    resumed = run_faulty(tmp_path, {"val_bpb": [2.8]}, f"resume={run}", "trainer.eval_interval=6", cache_dir=cache_dir)
    final = json.loads((run / "checkpoints" / "step_0000006" / "state.json").read_text())
    assert (final["best_val_bpb"], final["best_step"], final["skipped_steps"]) == (2.5, 4, 1)
    assert [p.name for p in (run / "checkpoints" / "best").iterdir()] == ["step_0000004"]
    assert final["elapsed_before"] > at_stop["elapsed_before"]
    assert f"best val bits per byte 2.5000 at step 4: {run}/checkpoints/best" in resumed.stdout
    assert "skipped 1 non-finite step(s)" in resumed.stdout  # the summary counts the whole run


def test_a_resume_says_what_it_cannot_change(tmp_path, cache_dir):
    """A resume continues a run: another optimizer kind, other data, another data order (data.sampling) or a
    checkpoint without a training config are refused in one line before anything trains, with advice a resume
    can follow."""
    run_train(tmp_path, "trainer.max_steps=8", "trainer.stop_at_step=4", "trainer.ckpt_interval=4", cache_dir=cache_dir)
    (run,) = run_dirs(tmp_path)
    ckpt = run / "checkpoints" / "step_0000004"
    cases = [
        (
            ["optim.name=muon"],
            f"cannot resume {ckpt} with optim.name=muon: its optimizer state is adamw's; "
            "resume with optim.name=adamw, or start a new run",
        ),
        (
            ["data.vocab_size=600"],
            f"cannot resume {ckpt} with data.vocab_size=600: a resume trains on the checkpoint's data and tokenizer; "
            "it may change trainer.*, optim.* values, logger.*, data.path (the same corpus, moved) and "
            f"data.cache_dir — for other data, start a new run from its weights: init_from={ckpt}",
        ),
        (
            ["data.sampling=random"],
            f"cannot resume {ckpt} with data.sampling=random: its run draws batches with "
            "data.sampling=epochs and a resume continues that order; drop the override, "
            f"or start a new run from its weights: init_from={ckpt}",
        ),
    ]
    for overrides, message in cases:
        proc = run_train(tmp_path, f"resume={run}", *overrides, cache_dir=cache_dir, check=False)
        assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(f"error: {message}"), (
            proc.stderr
        )
    (ckpt / "config.yaml").write_text("")
    proc = run_train(tmp_path, f"resume={run}", "verify_checkpoint=false", cache_dir=cache_dir, check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        f"error: {ckpt}/config.yaml holds no training config (no model, data, optim, trainer: empty, or an imported "
        "checkpoint), so it cannot be resumed; generate.py, evaluate.py and export_hf.py do not need it"
    )
    assert run_dirs(tmp_path) == [run]  # and no failed attempt left a directory


def test_failed_starts_leave_no_directory_behind(tmp_path, cache_dir):
    """A data error after Hydra made the run directory (its train.log holds the failure), and resume=latest
    with nothing to resume: no run directory, and no empty date folder either."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n')
    proc = run_train(tmp_path, "data=local", f"data.path={bad}", cache_dir=cache_dir, check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("error: ")
    proc = run_train(tmp_path, "resume=latest", cache_dir=cache_dir, check=False)
    assert proc.returncode == 1 and "'latest' found no checkpoint" in proc.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())


def run_unprivileged(tmp_path, *overrides):
    """train.py as a user under whom permission bits bind (root's overrides dropped: tests/fault_injection.py)."""
    launcher = [sys.executable, str(REPO / "tests" / "fault_injection.py"), json.dumps({"unprivileged": True})]
    args = [a for a in tiny_args(tmp_path, overrides) if not a.startswith(("outputs_dir=", "data.cache_dir="))]
    return launch(launcher, [*args, *overrides], check=False)


def test_a_read_only_token_cache_serves_a_hit_and_refuses_a_miss_in_one_line(tmp_path, tiny_data_cache):
    """A shared, read-only token cache (the normal case on a cluster): a run whose cache is there trains
    without writing to it; one that would need a new cache says so in one line."""
    import shutil

    shared = tmp_path / "shared"
    shutil.copytree(tiny_data_cache, shared)
    for path in [shared, *shared.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    (tmp_path / "outputs").mkdir()
    hit = run_unprivileged(
        tmp_path,
        f"outputs_dir={tmp_path / 'outputs'}",
        f"data.cache_dir={shared}",
        "trainer.max_steps=2",
        "trainer.eval_interval=2",
    )
    assert hit.returncode == 0, hit.stderr[-2000:]
    miss = run_unprivileged(
        tmp_path,
        f"outputs_dir={tmp_path / 'outputs'}",
        f"data.cache_dir={shared}",
        "data.vocab_size=300",
        "trainer.max_steps=2",
    )
    assert miss.returncode == 1 and miss.stderr.strip().splitlines()[-1] == (
        f"error: data.cache_dir {shared} holds no cache for these settings and cannot be written to (permission "
        "denied); point data.cache_dir at a writable directory, or prepare the cache there first"
    )


def test_a_read_only_outputs_dir_is_one_line_before_anything_starts(tmp_path, cache_dir):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    outputs.chmod(0o555)
    # The default run name (debug=tiny's is a plain string): it resolves through Hydra's runtime choices,
    # which the check must see too — a check that cannot resolve the path was a warning, and no check.
    proc = run_unprivileged(
        tmp_path,
        f"outputs_dir={outputs}",
        f"data.cache_dir={cache_dir}",
        "run_name=${hydra:runtime.choices.model}_${hydra:runtime.choices.data}",
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Callback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: cannot create the run directory {outputs}/") and line.endswith(
        f": permission denied ({outputs}); set outputs_dir=… to a writable directory"
    ), line


def test_a_run_directory_set_on_its_own_that_cannot_be_made_names_hydra_run_dir(tmp_path, cache_dir):
    """hydra.run.dir given explicitly (issue 68: the advice said outputs_dir, which it overrides): a file there, or a
    read-only folder, is one line naming hydra.run.dir."""
    (tmp_path / "notes.txt").write_text("mine")
    for run_dir, cause in ((tmp_path / "notes.txt", "it is a file"), (tmp_path / "notes.txt" / "run", "it is a file")):
        proc = run_train(tmp_path, f"hydra.run.dir={run_dir}", cache_dir=cache_dir, check=False)
        assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
            f"error: cannot create the run directory {run_dir}: {cause} ({tmp_path / 'notes.txt'}); set "
            "hydra.run.dir=… to a writable directory"
        ), proc.stderr[-1500:]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_early_stopping_ends_at_the_patience_and_best_is_an_alias(tmp_path, cache_dir, monkeypatch, capsys):
    """Scripted validation (3.0, 2.5, 2.6, 2.7 bpb every 2 steps) with patience 2: the run stops at step 8,
    saves it, and names the best (step 4); `best` then finds that checkpoint for generate, evaluate, export and
    resume — which refuses to restart a run that stopped early unless the patience is lifted."""
    from scripts import evaluate, export_hf, generate
    from training.program import exit_status

    proc = run_faulty(
        tmp_path,
        {"val_bpb": [3.0, 2.5, 2.6, 2.7]},
        "trainer.max_steps=20",
        "trainer.eval_interval=2",
        "trainer.ckpt_interval=20",
        "trainer.early_stopping=2",
        cache_dir=cache_dir,
    )
    (run,) = run_dirs(tmp_path)
    assert "step 8: stopping early — no lower validation bpb in 2 evaluations" in proc.stdout
    assert (
        "stopped early at step 8 of 20: no lower validation bpb in 2 evaluations (trainer.early_stopping)"
        in proc.stdout
    )
    assert f"best val bits per byte 2.5000 at step 4: {run}/checkpoints/best" in proc.stdout
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_0000008"]
    monkeypatch.chdir(tmp_path)  # `best` and `latest` look under ./outputs
    best = run / "checkpoints" / "best" / "step_0000004"
    assert exit_status(generate.main, ["best", "--prompt", "a", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    shown = best.relative_to(tmp_path)  # as found under ./outputs
    assert f"checkpoint: {shown} (cpu, fp32)" in capsys.readouterr().err
    (tmp_path / "t.txt").write_text("ROMEO: But soft!\n")
    assert exit_status(evaluate.main, ["best", "--text", str(tmp_path / "t.txt"), "--device", "cpu"]) == 0
    assert f"checkpoint: {shown} (cpu" in capsys.readouterr().err
    assert exit_status(export_hf.main, ["best", str(tmp_path / "hf")]) == 0  # says which checkpoint went out
    assert f"exported {shown} to {tmp_path / 'hf'}: load it with" in capsys.readouterr().out
    refused = run_train(tmp_path, f"resume={run}", cache_dir=cache_dir, check=False)
    assert refused.returncode == 1 and "ended its run early at step 8" in refused.stderr.strip().splitlines()[-1]
    resumed = run_train(tmp_path, "resume=best", "trainer.early_stopping=null", cache_dir=cache_dir)
    assert f"(resuming {best})" in resumed.stdout and "done: 20 steps" in resumed.stdout
    assert (run / "checkpoints" / "step_0000020").is_dir()


def test_early_stopping_works_without_keeping_the_best(tmp_path, cache_dir):
    """trainer.keep_best=false turns off checkpoints/best, not early stopping: the patience still counts the
    evaluations without a lower bpb (the best is tracked either way)."""
    proc = run_faulty(
        tmp_path,
        {"val_bpb": [3.0, 2.5, 2.6, 2.7]},
        "trainer.max_steps=20",
        "trainer.eval_interval=2",
        "trainer.ckpt_interval=20",
        "trainer.early_stopping=2",
        "trainer.keep_best=false",
        cache_dir=cache_dir,
    )
    (run,) = run_dirs(tmp_path)
    assert "stopped early at step 8 of 20: no lower validation bpb in 2 evaluations" in proc.stdout
    assert not (run / "checkpoints" / "best").exists()


def test_max_epochs_sets_the_steps_from_the_training_split(tmp_path, cache_dir):
    proc = run_train(tmp_path, "trainer.max_epochs=0.002", "trainer.eval_interval=1000", cache_dir=cache_dir)
    train_tokens = rows_train_tokens(proc)
    steps = -(-int(0.002 * train_tokens) // (4 * 64))  # ceil(epochs × tokens ÷ (micro batch 4 × seq 64))
    assert f"steps 0→{steps}" in proc.stdout and f"done: {steps} steps" in proc.stdout


def test_the_sample_a_run_prints_is_what_generate_py_makes_of_its_checkpoint(tmp_path, cache_dir, capsys):
    """One code path for the eval-time sample and scripts/generate.py: same sampling defaults, same seed,
    same text from the same weights. The default prompt is a new document (generate.py --prompt ''), which every
    corpus has: a fixed 'ROMEO:' put a Shakespeare speaker before every other corpus's samples."""
    from scripts import generate
    from training.program import exit_status

    proc = run_train(
        tmp_path,
        "trainer.max_steps=10",
        "trainer.eval_interval=10",
        "trainer.precision=fp32",
        "trainer.sample_tokens=12",
        cache_dir=cache_dir,
    )
    sample = proc.stdout.split("---- sample ----\n", 1)[1].split("\n----------------", 1)[0]
    (run,) = run_dirs(tmp_path)
    code = exit_status(
        generate.main,
        [
            str(run / "checkpoints" / "step_0000010"),
            "--prompt",
            "",
            "--seed",
            "0",
            "--max-new-tokens",
            "12",
            "--device",
            "cpu",
        ],
    )
    assert code == 0 and capsys.readouterr().out == sample + "\n"


def test_the_default_length_stops_a_small_corpus_at_its_passes_long_before_its_budget(tmp_path):
    """The default trainer settings (no debug=tiny, no length typed) on a ~9 KB text: 10 minutes or 4 passes,
    whichever comes first — the passes end the run in seconds, and it says so. Fails the day the default goes back
    to spending its budget on a corpus it has used up."""
    import sys

    from data.sources import load_plays
    from tests.train_helpers import launch

    corpus, cache_dir = tmp_path / "play.txt", tmp_path / "cache"  # its own cache: the meta read below is this corpus's
    corpus.write_text(load_plays()[0]["text"][:9000])
    proc = launch(
        [sys.executable],
        [
            f"outputs_dir={tmp_path / 'outputs'}",
            "model=tiny",
            "logger=none",
            "data=local",
            f"data.path={corpus}",
            "data.vocab_size=512",
            f"data.cache_dir={cache_dir}",
            "trainer.precision=fp32",
            "trainer.compile=false",
            "trainer.micro_batch_size=4",
            "trainer.num_threads=1",
            "trainer.sample_tokens=0",
        ],
    )
    (run,) = run_dirs(tmp_path)
    state = json.loads(max((run / "checkpoints").glob("step_*")).joinpath("state.json").read_text())
    meta = json.loads(next(cache_dir.glob("local-*/meta.json")).read_text())
    passes_end = -(-4 * windows_per_epoch(meta["train_tokens"], 64) // 4)
    assert state["step"] == passes_end and state["elapsed_before"] < 120
    assert (
        "(trainer.time_budget=10 min or 4 passes over every window (trainer.max_epochs=4), whichever comes first:"
    ) in proc.stdout
    assert f"done: {passes_end} steps" in proc.stdout
    assert "stopped at 4 passes over every window (trainer.max_epochs=4), after " in proc.stdout
    evals = [r for r in read_metrics(run) if r["kind"] == "eval"]
    assert len(evals) >= 10


def test_a_hand_edited_run_config_is_kept_and_said_never_silently_overwritten(tmp_path, cache_dir):
    """config.yaml in a run directory is what the run was given; a resume reads the checkpoint's config. An edit
    there (optim.lr) is named with where changes go, and the user's file is moved aside, not overwritten."""
    run_train(tmp_path, "trainer.max_steps=6", "trainer.stop_at_step=3", "trainer.ckpt_interval=3", cache_dir=cache_dir)
    (run,) = run_dirs(tmp_path)
    ckpt = run / "checkpoints" / "step_0000003"
    config = yaml.safe_load((run / "config.yaml").read_text())
    lr, config["optim"]["lr"] = config["optim"]["lr"], 0.0005
    edited = yaml.safe_dump(config)
    (run / "config.yaml").write_text(edited)
    resumed = run_train(tmp_path, f"resume={ckpt}", cache_dir=cache_dir)
    lines = [line for line in resumed.stderr.splitlines() if "differs from" in line]
    assert lines == [
        f"warning: {run}/config.yaml differs from {ckpt}/config.yaml in optim.lr (0.0005 there, {lr!r} in the "
        f"checkpoint): a resume reads the checkpoint's config, so changes go on the command line (python train.py "
        f"resume={ckpt} optim.lr=…); the file is kept as {run}/config.edited-1.yaml"
    ]
    assert (run / "config.edited-1.yaml").read_text() == edited
    assert (run / "config.yaml").read_text() == (run / "checkpoints" / "step_0000006" / "config.yaml").read_text()
    again = run_train(tmp_path, f"resume={run}", "trainer.max_steps=8", cache_dir=cache_dir)  # its own rewrite
    assert "differs from" not in again.stderr and not (run / "config.edited-2.yaml").exists()
