"""training/loop.py on the path a user runs: each promise README makes about a training run, checked
inside a real run of the loop (in this process, `debug=tiny`), so a refactor that keeps a helper but
stops calling it fails here. docs/testing.md's promise map points at these tests."""

import math
import os
import re
import signal
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import training.distributed
import training.loop
from analysis.runs import read_run
from data import SAMPLERS, prepare, windows_per_epoch
from tests.train_helpers import compose_train_config, read_metrics, train_in_process
from training.checkpoint import read_state
from training.distributed import DistInfo
from training.loop import CausalLMLoss

pytestmark = pytest.mark.serial  # trains: one at a time under make test's two workers (tests/fixtures.py)

SHORT = ["trainer.max_steps=4", "trainer.eval_interval=4", "trainer.ckpt_interval=4", "trainer.log_interval=1"]


@pytest.fixture
def forward_calls(monkeypatch):
    """(training?, autocast on?, autocast dtype) of every CausalLMLoss forward the loop makes."""
    calls, real = [], CausalLMLoss.forward

    def recording(self, input_ids, targets):
        calls.append((self.training, torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(self, input_ids, targets)

    monkeypatch.setattr(CausalLMLoss, "forward", recording)
    return calls


@pytest.mark.parametrize("precision, autocast_on", [("bf16", True), ("fp32", False)])
def test_training_and_evaluation_forwards_run_under_the_runs_precision(
    tmp_path, tiny_data_cache, forward_calls, precision, autocast_on
):
    train_in_process(
        tmp_path / "run",
        *SHORT,
        f"trainer.precision={precision}",
        "trainer.activation_rms=false",
        cache_dir=tiny_data_cache,
    )
    training, evaluating = [c for c in forward_calls if c[0]], [c for c in forward_calls if not c[0]]
    assert len(training) == 4 and evaluating  # one micro-batch per step, then the eval batches
    for _, enabled, dtype in training + evaluating:
        assert enabled is autocast_on and (not enabled or dtype == torch.bfloat16)


def test_a_bf16_run_keeps_fp32_master_weights_and_optimizer_state(tmp_path, tiny_data_cache):
    train_in_process(tmp_path / "run", *SHORT, "trainer.precision=bf16", cache_dir=tiny_data_cache)
    ckpt = tmp_path / "run" / "checkpoints" / "step_0000004"
    assert {v.dtype for v in load_file(ckpt / "model.safetensors").values()} == {torch.float32}
    optimizer = torch.load(ckpt / "optimizer.pt", weights_only=True)
    moments = [v for state in optimizer["state"].values() for k, v in state.items() if k.startswith("exp_avg")]
    assert moments and {m.dtype for m in moments} == {torch.float32}


def test_a_resume_on_another_machine_class_keeps_or_says_which_precision_it_trains_in(
    tmp_path, tiny_data_cache, monkeypatch, capsys
):
    """Sessions move between CPU classes. state.json and every train row record what the run trains in; a
    resume under `auto` keeps it, except bf16 where this CPU emulates it: then fp32, said in one warning line."""
    cpu = {"bf16": (True, "CPU reports AMX-bf16")}  # auto picks bf16
    monkeypatch.setattr(training.distributed, "cpu_bf16", lambda: cpu["bf16"])
    run, args = (
        tmp_path / "run",
        [
            "trainer.precision=auto",
            "trainer.max_steps=4",
            "trainer.ckpt_interval=2",
            "trainer.eval_interval=2",
            "trainer.log_interval=1",
            "trainer.activation_rms=false",
        ],
    )
    train_in_process(run, *args, "trainer.stop_at_step=2", cache_dir=tiny_data_cache)
    ckpt = run / "checkpoints" / "step_0000002"
    assert read_state(ckpt)["precision"] == "bf16" and read_run(run).precisions == ["bf16"]
    capsys.readouterr()
    resumed = train_in_process(run, *args, cache_dir=tiny_data_cache, resume_ckpt=ckpt)  # same class: still bf16
    assert "warning: this run trained in" not in capsys.readouterr().out
    assert (resumed.tokens_run, resumed.state.tokens_seen) == (2 * 256, 4 * 256)  # this process's tokens, the run's
    assert read_state(run / "checkpoints" / "step_0000004")["precision"] == "bf16"
    cpu["bf16"] = (False, "CPU reports no AMX/AVX512-BF16")  # an AVX2 CPU: bf16 emulated
    train_in_process(run, *args, cache_dir=tiny_data_cache, resume_ckpt=ckpt)
    out = capsys.readouterr().out
    assert "warning: this run trained in bf16 up to step 2 and continues in fp32" in out
    assert read_state(run / "checkpoints" / "step_0000004")["precision"] == "fp32"
    assert [(r["step"], r["precision"]) for r in read_metrics(run) if r["kind"] == "train"] == [
        (1, "bf16"),
        (2, "bf16"),
        (3, "fp32"),
        (4, "fp32"),
    ]
    assert read_run(run).precisions == ["bf16", "fp32"]


@pytest.mark.parametrize("tf32", [True, False])
def test_the_run_sets_tf32_for_its_device(tmp_path, tiny_data_cache, monkeypatch, tf32):
    """TF32 itself needs a CUDA device (test_precision.py flips the switches on a faked one); here the
    loop must ask for it, with the run's device and trainer.tf32."""
    asked, real = [], training.loop.enable_tf32
    monkeypatch.setattr(
        training.loop, "enable_tf32", lambda device, enabled: asked.append((device, enabled)) or real(device, enabled)
    )
    train_in_process(tmp_path / "run", *SHORT, f"trainer.tf32={str(tf32).lower()}", cache_dir=tiny_data_cache)
    assert asked == [(torch.device("cpu"), tf32)]


@pytest.fixture
def counting_compile(monkeypatch):
    """trainer.compile=true with a backend that counts calls of the compiled graphs and takes counts["seconds"] to
    'compile' (0 unless a test sets it): dynamo traces for real, without inductor's minute of C++ builds."""
    import time

    torch._dynamo.reset()  # graphs an earlier test compiled in this process would be reused, not compiled here
    counts = {"graph_calls": 0, "compiles": 0, "seconds": 0.0}

    def backend(gm, example_inputs):
        counts["compiles"] += 1
        time.sleep(counts["seconds"])

        def run(*args):
            counts["graph_calls"] += 1
            return gm.forward(*args)

        return run

    real_init = training.loop.CompiledLoss.__init__
    monkeypatch.setattr(
        training.loop.CompiledLoss,
        "__init__",
        lambda self, module, warn=print, **kw: real_init(self, module, warn, backend=backend),
    )
    return counts


COMPILE_NOTE = (
    "compile: the first training step and the first eval compile model + loss (up to a minute or two on "
    "a CPU); the progress bar waits meanwhile"
)


def test_a_compiled_run_trains_through_the_compiled_graph(tmp_path, tiny_data_cache, counting_compile, capsys):
    train_in_process(
        tmp_path / "run", *SHORT, "trainer.compile=true", "trainer.activation_rms=false", cache_dir=tiny_data_cache
    )
    assert counting_compile["compiles"] >= 2  # training and evaluation graphs
    # Every training step and the eval batches went through a compiled graph.
    assert counting_compile["graph_calls"] >= 4 + 2
    assert COMPILE_NOTE in capsys.readouterr().out  # why the progress bar waits


def test_an_eager_run_says_nothing_of_compiling(tmp_path, tiny_data_cache, capsys):
    train_in_process(tmp_path / "run", *SHORT, "trainer.compile=false", cache_dir=tiny_data_cache)
    assert "compile: the first training step" not in capsys.readouterr().out


def test_the_progress_bar_shows_the_steps_epochs_loss_learning_rate_and_tokens_per_second(
    tmp_path, tiny_data_cache, capsys
):
    """The bar a user watches on stdout: steps done of the planned total and, from each logged row, the epochs,
    loss, learning rate and tokens/s — its last drawing is the last train row of metrics.jsonl, rounded as shown."""
    train_in_process(tmp_path / "run", *SHORT, "trainer.compile=false", cache_dir=tiny_data_cache)
    out = capsys.readouterr().out
    bars = re.findall(
        r"train: +\d+%\|[^|]*\| *(\d+)/(\d+) \[[^\]]*, ep=([\d.]+), loss=([\d.]+), lr=([^,]+), "
        r"tok_s=([\d,]+)\]",
        out,
    )
    assert bars, out
    row = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"][-1]
    assert bars[-1] == (
        "4",
        "4",
        f"{row['epochs']:.2f}",
        f"{row['loss']:.3f}",
        f"{row['lr']:.1e}",
        f"{row['tokens_per_s']:,.0f}",
    )


def test_tokens_per_second_exclude_compile_time(tmp_path, tiny_data_cache, counting_compile):
    counting_compile["seconds"] = 0.5  # each compile (on top of dynamo's tracing)
    train_in_process(
        tmp_path / "run",
        "trainer.max_steps=4",
        "trainer.log_interval=2",
        "trainer.eval_interval=4",
        "trainer.ckpt_interval=4",
        "trainer.compile=true",
        cache_dir=tiny_data_cache,
    )
    first = next(r for r in read_metrics(tmp_path / "run") if r["kind"] == "train")
    tokens = 2 * 4 * 64  # two steps of micro batch 4 × seq 64
    assert first["compile_s"] >= 0.5
    # Counted, the compile time alone would cap tokens/s at tokens / compile_s; any margin above 1 tells the two
    # apart, and a small one keeps a slow machine (or mutmut's trampolines) from failing a correct loop.
    assert first["tokens_per_s"] > 1.5 * tokens / first["compile_s"]


def test_gradient_clipping_is_applied_by_the_loop(tmp_path, tiny_data_cache):
    """optim.grad_clip reaches the step: with a clip of 1e-12 AdamW's update (m/√v, where eps dominates
    gradients that small) nearly vanishes, while the logged grad norm stays the unclipped one."""
    moved = {}
    for clip in (1.0, 1e-12):
        run = tmp_path / f"clip{clip}"
        outcome = train_in_process(
            run, *SHORT, f"optim.grad_clip={clip}", "model.dropout=0.0", cache_dir=tiny_data_cache
        )
        assert outcome.state.step == 4
        final = load_file(run / "checkpoints" / "step_0000004" / "model.safetensors")
        torch.manual_seed(0)
        moved[clip] = max((final[k] - v).abs().max().item() for k, v in _initial_weights(run).items())
        norms = [r["grad_norm"] for r in read_metrics(run) if r["kind"] == "train"]
        assert min(norms) > 1e-3  # logged before clipping
    assert moved[1e-12] < moved[1.0] / 100


def _initial_weights(run) -> dict:
    """The run's weights at step 0: its model rebuilt from the same seed."""
    from model import ModelConfig, Transformer
    from training.checkpoint import load_model_config

    cfg: ModelConfig = load_model_config(run / "checkpoints" / "step_0000004")
    torch.manual_seed(0)
    state = Transformer(cfg).state_dict()
    state.pop("lm_head.weight", None)
    return state


@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_summary_reads_the_runs_state(tmp_path, tiny_data_cache, accumulation):
    """Tokens count every micro-batch of a step: micro batch 4 × seq 64 × accumulation steps."""
    outcome = train_in_process(
        tmp_path / "run", *SHORT, f"trainer.grad_accum_steps={accumulation}", cache_dir=tiny_data_cache
    )
    per_step = 4 * 64 * accumulation
    assert outcome.state.step == 4 and outcome.tokens_run == 4 * per_step
    assert [r["tokens"] for r in read_metrics(tmp_path / "run") if r["kind"] == "train"] == [
        per_step * step for step in (1, 2, 3, 4)
    ]
    assert outcome.state.best_step == 4 and math.isfinite(outcome.state.best_val_bpb)
    assert outcome.last_eval["val_bpb"] == outcome.state.best_val_bpb
    assert 0 < outcome.wall_s < 600 and outcome.signum is None and outcome.checkpoint.name == "step_0000004"


def test_max_epochs_plans_the_steps_from_the_tokens_of_a_step(tmp_path, tiny_data_cache):
    """trainer.max_epochs: the run ends at ceil(epochs × train tokens / tokens per step), a step being every
    micro-batch of it (here 2 × 4 windows of 64)."""
    from data import prepare
    from tests.train_helpers import compose_train_config

    cfg, _ = compose_train_config(["debug=tiny", f"data.cache_dir={tiny_data_cache}"])
    train_tokens = prepare(cfg.data, seq_len=64, model_vocab_size=cfg.model.vocab_size, log=lambda *a: None).meta[
        "train_tokens"
    ]
    epochs = 3.5 * 512 / train_tokens  # three and a half steps' worth of tokens
    outcome = train_in_process(
        tmp_path / "run",
        f"trainer.max_epochs={epochs}",
        "trainer.grad_accum_steps=2",
        "trainer.eval_interval=100",
        "trainer.ckpt_interval=100",
        cache_dir=tiny_data_cache,
    )
    assert outcome.state.step == outcome.state.max_steps == 4


def test_max_epochs_under_epochs_sampling_is_that_many_passes_over_every_window():
    """data.sampling=epochs: steps = ceil(epochs × windows per epoch ÷ (micro batch × world size × accumulation)),
    the fewest steps whose windows cover the epochs; random keeps its epoch-equivalents of training tokens."""
    for epochs, batch, accum, world in [(1, 7, 1, 1), (2, 1, 1, 1), (2.5, 3, 2, 2), (4, 5, 3, 1)]:
        cfg, _ = compose_train_config(
            [
                "debug=tiny",
                "data.sampling=epochs",
                f"trainer.max_epochs={epochs}",
                f"trainer.micro_batch_size={batch}",
                f"trainer.grad_accum_steps={accum}",
            ]
        )
        per_step = batch * world * accum
        steps = training.loop.planned_steps(cfg, 1_000, per_step * 64)
        per_epoch = windows_per_epoch(1_000, 64)  # (1000 - 64) // 64 = 14 windows of 64
        assert per_epoch == 14 and steps == math.ceil(epochs * per_epoch / per_step)
        assert (steps - 1) * per_step < epochs * per_epoch <= steps * per_step
    cfg.data.sampling = "random"  # 4 epoch-equivalents: 4 × 1000 tokens ÷ (5 × 3 × 64), drawn with replacement
    assert training.loop.planned_steps(cfg, 1_000, 5 * 3 * 64) == math.ceil(4 * 1_000 / (5 * 3 * 64)) == 5


@pytest.mark.parametrize("sampling", ["random", "epochs"])
def test_the_run_reads_its_batches_with_the_sampler_data_sampling_names(sampling):
    cfg, _ = compose_train_config(["debug=tiny", f"data.sampling={sampling}", "trainer.grad_accum_steps=3"])
    tokens = np.arange(10_000, dtype=np.int64)
    data = SimpleNamespace(train_tokens=lambda: tokens, val_tokens=lambda: tokens)
    batches, _ = training.loop.data_views(cfg, data, DistInfo())
    assert type(batches) is SAMPLERS[sampling] and batches.grad_accum_steps == 3


def test_epochs_sampling_trains_its_epochs_and_resumes_bitwise(tmp_path, tiny_data_cache, capsys):
    """data.sampling=epochs end to end: trainer.max_epochs plans its passes, the logged epochs count them,
    state.json records the sampler, and a run stopped part-way resumes to the uninterrupted run's weights bit
    for bit. A resume with another sampler is refused before it trains; one with another batch is warned of."""
    cfg, _ = compose_train_config(["debug=tiny", f"data.cache_dir={tiny_data_cache}"])
    train_tokens = prepare(cfg.data, seq_len=64, log=lambda *a: None).meta["train_tokens"]
    per_epoch = windows_per_epoch(train_tokens, 64)
    epochs = 5.5 * 8 / per_epoch  # five and a half steps of 2 micro-steps × 4 windows: 6 steps
    args = [
        "data.sampling=epochs",
        f"trainer.max_epochs={epochs}",
        "trainer.grad_accum_steps=2",
        "trainer.eval_interval=100",
        "trainer.ckpt_interval=100",
        "trainer.log_interval=1",
        "trainer.activation_rms=false",
    ]
    whole = train_in_process(tmp_path / "whole", *args, cache_dir=tiny_data_cache)
    assert (
        whole.state.step == 6
        and f"steps 0→6 (trainer.max_epochs={epochs:g}: passes over every window)" in capsys.readouterr().out
    )
    logged = [r["epochs"] for r in read_metrics(tmp_path / "whole") if r["kind"] == "train"]
    assert logged == pytest.approx([step * 8 / per_epoch for step in range(1, 7)])
    part = train_in_process(tmp_path / "part", *args, "trainer.stop_at_step=3", cache_dir=tiny_data_cache)
    state = read_state(part.checkpoint)
    assert (state["seed"], state["step"], state["sampling"]) == (0, 3, "epochs")
    random_args = [
        *(a for a in args if not a.startswith(("data.sampling", "trainer.max_epochs"))),
        "data.sampling=random",
    ]
    with pytest.raises(
        ValueError,
        match=r"drew its batches with data.sampling=epochs, this run with "
        r"data.sampling=random; resume with data.sampling=epochs",
    ):
        train_in_process(tmp_path / "part", *random_args, cache_dir=tiny_data_cache, resume_ckpt=part.checkpoint)
    resumed = train_in_process(tmp_path / "part", *args, cache_dir=tiny_data_cache, resume_ckpt=part.checkpoint)
    assert "data.sampling=epochs run trained" not in capsys.readouterr().out
    ends = [load_file(outcome.checkpoint / "model.safetensors") for outcome in (whole, resumed)]
    assert resumed.state.step == 6 and all(torch.equal(ends[0][k], ends[1][k]) for k in ends[0])
    train_in_process(
        tmp_path / "part",
        *args,
        "trainer.micro_batch_size=2",
        "trainer.stop_at_step=4",
        cache_dir=tiny_data_cache,
        resume_ckpt=part.checkpoint,
    )
    assert (
        "warning: this data.sampling=epochs run trained 1,536 tokens in 3 steps, not 3 × 256 (this resume's "
        "tokens per step)"
    ) in capsys.readouterr().out


def test_stop_at_step_stops_there_and_the_checkpoint_says_where_the_data_order_continues(tmp_path, tiny_data_cache):
    """trainer.stop_at_step=2 of 6: the run stops and saves at step 2, its schedule still planned for 6; state.json
    holds what a resume continues from (training/checkpoint/run_state.py): the seed the data order follows, the world size."""
    outcome = train_in_process(
        tmp_path / "run",
        "seed=7",
        "trainer.max_steps=6",
        "trainer.stop_at_step=2",
        "trainer.eval_interval=100",
        "trainer.ckpt_interval=100",
        cache_dir=tiny_data_cache,
    )
    assert (outcome.state.step, outcome.state.max_steps, outcome.checkpoint.name) == (2, 6, "step_0000002")
    state = read_state(outcome.checkpoint)
    assert (state["seed"], state["step"], state["sampling"], state["world_size"]) == (7, 2, "epochs", 1)


@pytest.mark.parametrize("precision, measured", [("bf16", "bfloat16"), ("fp32", "float32")])
def test_the_header_names_the_run_and_measures_the_peak_in_the_runs_precision(
    tmp_path, tiny_data_cache, capsys, precision, measured
):
    train_in_process(
        tmp_path / "run",
        *SHORT,
        f"trainer.precision={precision}",
        "trainer.peak_tflops=null",
        cache_dir=tiny_data_cache,
    )
    out = capsys.readouterr().out
    assert f"run dir: {tmp_path / 'run'}\nmodel: rmsnorm + swiglu" in out
    assert f" TFLOP/s (one quick {measured} matmul probe on cpu, 1 threads), steps 0→4" in out


def test_a_given_peak_is_used_as_is_and_mfu_counts_the_trained_window_length(tmp_path, tiny_data_cache, capsys):
    """trainer.peak_tflops skips the measurement; MFU = tokens/s × FLOPs per token of seq_len-token windows
    (here 32 of the model's 64 positions: attention's share depends on it) / that peak."""
    from model import Transformer
    from training.checkpoint import load_model_config

    run = tmp_path / "run"
    train_in_process(run, *SHORT, "trainer.peak_tflops=2", "trainer.seq_len=32", cache_dir=tiny_data_cache)
    assert "MFU peak 2.00 TFLOP/s (trainer.peak_tflops), steps 0→4" in capsys.readouterr().out
    flops = Transformer(load_model_config(run / "checkpoints" / "step_0000004")).flops_per_token(32)
    assert flops != Transformer(load_model_config(run / "checkpoints" / "step_0000004")).flops_per_token(64)
    for row in (r for r in read_metrics(run) if r["kind"] == "train"):
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * flops / 2e12, rel=1e-6)


def test_a_time_budget_plans_the_steps_of_a_run_in_process(tmp_path, tiny_data_cache, capsys):
    """trainer.time_budget (training/budget.py) through the loop on the real clock: the first plan after the probe,
    the run ends where the last plan says, and the checkpoint's state records the plans (test_budget.py drives
    it with a step clock, and with a kill -9)."""
    from training.budget import PROBE_STEPS, WARMUP_STEPS

    outcome = train_in_process(
        tmp_path / "run",
        "trainer.time_budget=0.04",  # debug=tiny's max_steps then off
        "trainer.eval_interval=100000",
        "trainer.ckpt_interval=100000",
        "trainer.sample_tokens=0",
        cache_dir=tiny_data_cache,
    )
    assert outcome.state.budget_minutes == 0.04 and outcome.state.max_steps > WARMUP_STEPS + PROBE_STEPS
    assert outcome.state.step == outcome.state.max_steps
    budget = read_state(outcome.checkpoint)
    assert (budget["budget_minutes"], budget["max_steps"], budget["plans"][-1]["max_steps"]) == (
        0.04,
        *[outcome.state.step] * 2,
    )
    assert budget["plans"][0]["at_step"] == WARMUP_STEPS + PROBE_STEPS
    assert "time budget 0.04 min → " in capsys.readouterr().out


def poison_step(monkeypatch, *bad_steps: int) -> None:
    """A NaN loss (so NaN gradients) at these optimizer steps (1-based) of the loop's TrainStep."""
    from tests.fault_injection import poisoned

    monkeypatch.setattr(training.loop.TrainStep, "__call__", poisoned(training.loop.TrainStep.__call__, bad_steps))


def test_skip_nonfinite_steps_reaches_the_step(tmp_path, tiny_data_cache, monkeypatch):
    """trainer.skip_nonfinite_steps=2 and a NaN loss at step 2 of 4: the loop's TrainStep skips that update and
    the run finishes, one step counted as skipped (the default, 0, would stop there)."""
    poison_step(monkeypatch, 2)
    outcome = train_in_process(tmp_path / "run", *SHORT, "trainer.skip_nonfinite_steps=2", cache_dir=tiny_data_cache)
    assert (outcome.state.step, outcome.state.skipped_steps) == (4, 1)


def test_a_streak_of_bad_steps_stops_the_loop_naming_the_step_and_the_last_good_checkpoint(
    tmp_path, tiny_data_cache, monkeypatch
):
    from training.loop import NonFiniteLoss

    poison_step(monkeypatch, 3, 4)
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLoss) as e:
        train_in_process(
            run,
            *SHORT,
            "trainer.max_steps=6",
            "trainer.ckpt_interval=1",
            "trainer.skip_nonfinite_steps=2",
            cache_dir=tiny_data_cache,
        )
    assert str(e.value).startswith(
        "2 non-finite steps in a row (trainer.skip_nonfinite_steps=2) by step 4; the last "
        f"good checkpoint is {run / 'checkpoints' / 'step_0000003'} — "
    )


@pytest.mark.parametrize("first", ["log", "eval", "ckpt"])
def test_no_log_eval_or_save_happens_past_an_unchecked_bad_step(tmp_path, tiny_data_cache, monkeypatch, first):
    """A NaN at step 1; the first event after it (a log, an eval or a checkpoint at step 2) checks the guard
    first, so the run stops there naming step 1 and nothing of step 2 is written."""
    from training.loop import NonFiniteLoss

    poison_step(monkeypatch, 1)
    intervals = {"log": 100, "eval": 100, "ckpt": 100, first: 2}
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLoss, match="at step 1"):
        train_in_process(
            run,
            "trainer.max_steps=6",
            *(f"trainer.{k}_interval={v}" for k, v in intervals.items()),
            cache_dir=tiny_data_cache,
        )
    assert read_metrics(run) == [] and not (run / "checkpoints" / "step_0000002").exists()


def test_wandb_gets_the_resolved_config_and_every_logged_row(tmp_path, tiny_data_cache, monkeypatch):
    """logger=wandb: the run opens wandb with its resolved config (what wandb's UI filters and groups runs by)
    and logs every metrics row at its step. wandb itself is faked: what the loop hands it is the point."""
    import training.log

    opened = {}

    class FakeRun:
        def __init__(self):
            self.rows, self.finished = [], False

        def log(self, values, step):
            self.rows.append((step, values))

        def finish(self):
            self.finished = True

    def open_wandb(run_dir, cfg, run_name, config):
        opened.update(config=config, run=FakeRun())
        return opened["run"]

    monkeypatch.setattr(training.log, "open_wandb", open_wandb)
    train_in_process(tmp_path / "run", *SHORT, "logger=wandb", cache_dir=tiny_data_cache)
    assert opened["config"]["model"]["hidden_size"] == 64 and opened["config"]["trainer"]["max_steps"] == 4
    assert [step for step, _ in opened["run"].rows] == [1, 2, 3, 4, 4] and opened["run"].finished


@pytest.mark.parametrize("rank", [0, 1])
def test_only_the_main_rank_speaks(monkeypatch, capsys, rank):
    """Under torchrun every rank runs the loop; only rank 0 prints (the header, notes, the stop line)."""
    from training.distributed import DistInfo

    def build(cfg, info, say, resume, init):
        say("the header")
        raise RuntimeError("stop here")

    monkeypatch.setattr(training.loop, "build", build)
    with pytest.raises(RuntimeError, match="stop here"):
        training.loop.train(training.loop.RunSpec(cfg=None, run_dir=None, config_yaml=""), DistInfo(rank=rank), None)
    assert capsys.readouterr().out == ("the header\n" if rank == 0 else "")


def raise_at_step(monkeypatch, step: int, action):
    """Call `action()` as the loop schedules optimizer step `step` (0-based), inside the loop's try."""
    real = training.loop.apply_schedule
    monkeypatch.setattr(
        training.loop,
        "apply_schedule",
        lambda optimizers, at, *args: (action() if at == step else None) or real(optimizers, at, *args),
    )


@pytest.mark.parametrize("ckpt_interval", [100, 3])
def test_a_signal_saves_the_step_it_stopped_at_once_and_says_how_to_resume(
    tmp_path, tiny_data_cache, monkeypatch, capsys, ckpt_interval
):
    """SIGTERM during step 3 of 8: the step finishes, the loop stops before the next one and saves step 3 — once,
    even when step 3 is a periodic save too — says how to resume, and puts the handlers it replaced back."""
    saves, real_save = [], training.loop.Checkpointer.save
    monkeypatch.setattr(
        training.loop.Checkpointer, "save", lambda self: saves.append(self.state.step) or real_save(self)
    )
    raise_at_step(monkeypatch, 2, lambda: signal.raise_signal(signal.SIGTERM))
    handler = signal.getsignal(signal.SIGTERM)
    run = tmp_path / "run"
    outcome = train_in_process(
        run,
        "trainer.max_steps=8",
        f"trainer.ckpt_interval={ckpt_interval}",
        "trainer.eval_interval=100",
        cache_dir=tiny_data_cache,
    )
    assert (outcome.signum, outcome.state.step, saves) == (signal.SIGTERM, 3, [3])
    assert outcome.checkpoint == run / "checkpoints" / "step_0000003"
    assert (
        f"\nSIGTERM: checkpoint saved at step 3: {outcome.checkpoint}\nresume with: python train.py resume={run}\n"
        in capsys.readouterr().out
    )
    assert signal.getsignal(signal.SIGTERM) is handler


def test_a_lost_peer_raises_one_line_naming_the_last_intact_checkpoint(tmp_path, tiny_data_cache, monkeypatch):
    """gloo's error when another rank dies becomes PeerLost (its one line in train.py); any other RuntimeError
    goes up unchanged. torchrun tests kill a real rank; this checks the loop's branch where mutmut can see it."""
    from training import distributed as D

    # The real peer_lost answers only in a world of 2+ ranks; this one reads the rank info the loop hands it.
    monkeypatch.setattr(
        D, "peer_lost", lambda e, info: "Connection reset by peer" if "reset" in str(e) and info.rank == 0 else None
    )

    def lose_peer():
        raise RuntimeError("[gloo] Connection reset by peer")

    raise_at_step(monkeypatch, 2, lose_peer)
    run = tmp_path / "run"
    with pytest.raises(D.PeerLost) as e:
        train_in_process(
            run,
            "trainer.max_steps=8",
            "trainer.ckpt_interval=2",
            "trainer.eval_interval=100",
            cache_dir=tiny_data_cache,
        )
    assert str(e.value) == (
        "rank 0 lost contact with the other ranks (Connection reset by peer): another process of "
        f"this torchrun job stopped (killed, or ended by an error of its own, which its line names); the last checkpoint, {run}/checkpoints/step_0000002, "
        "is intact: resume from it"
    )

    def fail():
        raise RuntimeError("some other failure")

    raise_at_step(monkeypatch, 1, fail)
    with pytest.raises(RuntimeError, match="^some other failure$"):
        train_in_process(tmp_path / "other", "trainer.max_steps=8", cache_dir=tiny_data_cache)


def test_a_lost_peer_is_told_which_checkpoint_to_resume_from():
    """The PeerLost line's advice: the last intact checkpoint, or that none was written."""
    from types import SimpleNamespace

    from training.loop import _last_checkpoint

    assert _last_checkpoint(SimpleNamespace(last_good=lambda: None)) == "no checkpoint was written yet"
    assert _last_checkpoint(SimpleNamespace(last_good=lambda: "ck/step_0000004")) == (
        "the last checkpoint, ck/step_0000004, is intact: resume from it"
    )


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_a_resume_that_moves_the_end_says_what_the_learning_rate_does(tmp_path, tiny_data_cache, capsys, schedule):
    """A larger trainer.max_steps on resume changes the learning rate where the run continues: said in one line,
    with both values (computed here by hand); a resume to the same end says nothing."""
    run, args = (
        tmp_path / "run",
        [
            f"optim.schedule={schedule}",
            "optim.name=adamw",
            "trainer.eval_interval=100",
            "trainer.ckpt_interval=4",
            "trainer.activation_rms=false",
            "optim.decay_fraction=0.5",
        ],
    )
    train_in_process(run, *args, "trainer.max_steps=8", "trainer.stop_at_step=6", cache_dir=tiny_data_cache)
    ckpt = run / "checkpoints" / "step_0000006"
    assert read_state(ckpt)["max_steps"] == 8
    capsys.readouterr()
    train_in_process(run, *args, "trainer.max_steps=8", cache_dir=tiny_data_cache, resume_ckpt=ckpt)
    assert "resume: the schedule" not in capsys.readouterr().out
    train_in_process(run, *args, "trainer.max_steps=16", cache_dir=tiny_data_cache, resume_ckpt=ckpt)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resume: the schedule")]
    optim = compose_train_config(["debug=tiny", *args])[0].optim
    w = optim.warmup_steps
    if schedule == "wsd":  # of 8: 1-sqrt decay from half-way (not inside the warmup); of 16: stable, the peak
        start = max(w, 8 - 4)
        old = optim.min_lr + (1 - math.sqrt((6 - start) / (8 - start))) * (optim.lr - optim.min_lr)
        new = optim.lr
    else:  # cosine from the peak after warmup to min_lr at the end
        cosine = lambda end: (
            optim.min_lr + 0.5 * (1 + math.cos(math.pi * (6 - w) / (end - w))) * (optim.lr - optim.min_lr)
        )  # noqa: E731
        old, new = cosine(8), cosine(16)
    stretch = " (cosine's curve stretches to the new end; optim.schedule=wsd keeps its stable phase)"
    assert lines == [
        f"resume: the schedule now ends at step 16, not 8; the learning rate at step 6 goes from "
        f"{old:.3g} to {new:.3g} at once" + (stretch if schedule == "cosine" else "")
    ]


def test_a_resume_on_another_torch_or_cpu_capability_says_it_is_no_longer_bitwise(
    tmp_path, tiny_data_cache, monkeypatch, capsys
):
    """state.json records torch's version and the kernels' target; a resume where either differs trains on and says
    so in one line (an fp32 run capped to AVX2 and resumed natively differed after 6 steps); the same machine says
    nothing."""
    args = ["trainer.precision=fp32", "trainer.max_steps=4", "trainer.ckpt_interval=2", "trainer.eval_interval=4"]
    run = tmp_path / "run"
    train_in_process(run, *args, "trainer.stop_at_step=2", cache_dir=tiny_data_cache)
    ckpt = run / "checkpoints" / "step_0000002"
    here = training.distributed.compute_identity(torch.device("cpu"))
    assert read_state(ckpt)["machine"] == here and here.startswith(f"torch {torch.__version__}, cpu ")
    capsys.readouterr()
    train_in_process(run, *args, cache_dir=tiny_data_cache, resume_ckpt=ckpt)
    assert "no longer bitwise" not in capsys.readouterr().out
    # another cap than the suite's own (`env ONEDNN_MAX_CPU_ISA=AVX2 make test` emulates an AVX2 machine)
    isa = "SSE41" if os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2" else "AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    train_in_process(run, *args, cache_dir=tiny_data_cache, resume_ckpt=ckpt)
    lines = [line for line in capsys.readouterr().out.splitlines() if "no longer bitwise" in line]
    assert lines == [
        f"warning: this run trained on {here} up to step 2 and continues on {here.split(', ONEDNN')[0]}, "
        f"ONEDNN_MAX_CPU_ISA={isa}: it goes on, but is no longer bitwise what an uninterrupted run computes (other "
        "kernels round differently)"
    ]
    assert (
        read_state(run / "checkpoints" / "step_0000004")["machine"]
        == f"{here.split(', ONEDNN')[0]}, ONEDNN_MAX_CPU_ISA={isa}"
    )
