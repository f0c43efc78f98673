"""Scale-out on CPU with gloo, compiled (model + loss) as by default: DDP and FSDP2 equal one process
with the same global batch (train loss, validation loss, weights); the logged loss and grad norm are the global batch's; accumulation all-reduces
once per optimizer step; a checkpoint resumes exactly on the same world size and continues on another;
a hung rank fails the run within trainer.dist_timeout_s and every rank tears its process group down.

The one-process reference runs in this process (training/loop.py, no ~6 s interpreter start). The DDP and
FSDP2 runs that check what the ranks compute start each rank as torchrun does (its environment) but
forked from the preloaded server (train_helpers.run_ranks); what torchrun itself does — SIGTERM to one
rank, a hung rank — goes through `torchrun`."""

import contextlib
import json
import math
import os
import re
import signal
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from safetensors.torch import load_file

from data import SAMPLERS, prepare
from model import Transformer
from tests import forked
from tests.train_helpers import (
    REPO,
    compose_train_config,
    launch,
    read_metrics,
    run_dirs,
    run_ranks,
    run_train,
    running,
    tiny_args,
    torchrun_worker,
    train_in_process,
    wait_for_step,
)
from training import distributed as D
from training.checkpoint import load_model
from training.loop import CausalLMLoss, TrainStep

pytestmark = [pytest.mark.distributed, pytest.mark.serial]

# fp32 so the only differences left are summation order; every step logged; evals at 6 and 12. Two
# micro-steps of 4 windows per optimizer step: 2 ranks × micro batch 2, or 1 process × micro batch 4.
EXACT = [
    "trainer.precision=fp32",
    "trainer.max_steps=12",
    "trainer.log_interval=1",
    "trainer.eval_interval=6",
    "trainer.ckpt_interval=6",
    "trainer.grad_accum_steps=2",
]
ONE_PROCESS = [*EXACT, "trainer.micro_batch_size=4"]
TWO_RANKS = [*EXACT, "trainer.micro_batch_size=2"]
# The 2-rank DDP runs are compiled (model + loss, through DDP's graph splitting): dynamo and AOT
# autograd as in any compile, with the aot_eager backend instead of inductor's minute of C++ builds.
COMPILED = ["trainer.compile=true"]
AOT_EAGER = {"compile_backend": "aot_eager"}


def train_rows(run):
    return {r["step"]: r for r in read_metrics(run) if r["kind"] == "train"}


def val_losses(run):
    return {r["step"]: r["val_loss"] for r in read_metrics(run) if r["kind"] == "eval"}


def weights(run, step):
    return load_file(run / "checkpoints" / f"step_{step:07d}" / "model.safetensors")


def assert_same_run(run, reference, steps, rtol=1e-4):
    """Train loss and grad norm at every step, validation loss at every eval, weights at the last step."""
    ours, ref = train_rows(run), train_rows(reference)
    for step in steps:
        assert ours[step]["loss"] == pytest.approx(ref[step]["loss"], rel=rtol), step
        assert ours[step]["grad_norm"] == pytest.approx(ref[step]["grad_norm"], rel=10 * rtol), step
    evals = val_losses(reference)
    assert {s: v for s, v in val_losses(run).items() if s in steps} == pytest.approx(
        {s: v for s, v in evals.items() if s in steps}, rel=rtol
    )
    wa, wb = weights(run, steps[-1]), weights(reference, steps[-1])
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-5, msg=k)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_data_cache):
    """One process, micro batch 4 × 2 micro-steps: what every 2-rank run below must reproduce."""
    run = tmp_path_factory.mktemp("one_process") / "run"
    train_in_process(run, *ONE_PROCESS, cache_dir=tiny_data_cache)
    return run


TEARDOWN_LOG = "teardown.log"  # beside ddp_run's outputs/: "<rank> <group up before> <group up after>" per teardown


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, tiny_data_cache):
    root = tmp_path_factory.mktemp("ddp")
    proc = run_ranks(
        root,
        2,
        *TWO_RANKS,
        *COMPILED,
        cache_dir=tiny_data_cache,
        faults={**AOT_EAGER, "teardown_log": str(root / TEARDOWN_LOG)},
    )
    assert "parallel=ddp, compile: trainer.compile=true" in proc.stdout
    assert "2 micro batch × 64 seq_len × 2 accumulation × 2 processes" in proc.stdout
    assert "torch.compile failed" not in proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr  # e.g. DDP's FutureWarning for broadcast_buffers, once per rank
    (run,) = run_dirs(root)
    return run


def first_step_by_hand(cache_dir):
    """Loss and gradient norm of step 1 computed without the training code: the seeded initial model,
    cross-entropy of each micro-batch of the step's global batch, averaged (one process × batch 4
    draws exactly the windows 2 ranks × batch 2 draw)."""
    cfg, _ = compose_train_config(["debug=tiny", f"data.cache_dir={cache_dir}", *ONE_PROCESS])
    data = prepare(cfg.data, seq_len=cfg.trainer.seq_len, log=lambda *a: None)
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model)
    batches = SAMPLERS[cfg.data.sampling](
        data.train_tokens(),
        cfg.trainer.seq_len,
        cfg.trainer.micro_batch_size,
        cfg.seed,
        grad_accum_steps=cfg.trainer.grad_accum_steps,
    )
    losses = []
    for micro in range(cfg.trainer.grad_accum_steps):
        x, y = batches.get(0, micro)
        losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    loss = torch.stack(losses).mean()
    loss.backward()
    grad_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    return loss.item(), grad_norm.item()


def test_ddp_with_accumulation_matches_one_process(ddp_run, reference, tiny_data_cache):
    """2 ranks × micro batch 2 × 2 micro-steps = 1 process × micro batch 4 × 2 micro-steps: the same
    train losses and grad norms at every step, the same validation losses (all-reduced over the ranks'
    windows) and weights. Step 1 is also checked against a hand computation, so a loss logged as a sum
    of micro-batches (or of ranks) cannot hide behind both sides doing it."""
    assert_same_run(ddp_run, reference, steps=list(range(1, 13)))
    loss, grad_norm = first_step_by_hand(tiny_data_cache)
    assert train_rows(ddp_run)[1]["loss"] == pytest.approx(loss, rel=1e-5)
    assert train_rows(ddp_run)[1]["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert train_rows(ddp_run)[1]["tokens"] == 2 * 2 * 2 * 64  # micro × accumulation × ranks × seq_len


def test_sigterm_to_one_rank_stops_both_at_one_step_and_the_resume_is_exact(tmp_path, ddp_run, tiny_data_cache):
    """SIGTERM reaches rank 1 alone, right after its step 5: the ranks agree on the stop at that step
    boundary and save step 5 together, within seconds rather than after the collective timeout (a rank
    alone in save() would wait there for the other). `resume=` on two ranks then finishes the run
    bitwise equal to the uninterrupted ddp_run: losses, validation and weights."""
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(REPO / "tests" / "fault_injection.py"),
        json.dumps({"signal_at_step": [5, signal.SIGTERM, 1], **AOT_EAGER}),
    ]
    started = time.time()
    # A collective timeout far beyond the whole launch (~30 s here, more on a busy machine): a rank left
    # waiting in save() would show as a run that takes over 300 s.
    stopped = launch(
        launcher,
        tiny_args(tmp_path, [*TWO_RANKS, *COMPILED, "trainer.dist_timeout_s=300"], tiny_data_cache),
        check=False,
    )
    assert time.time() - started < 150, "the stop waited for the collective timeout"
    assert stopped.returncode != 0  # torchrun reports workers that exit 143 as failed, as a scheduler expects
    (part,) = run_dirs(tmp_path)
    assert f"SIGTERM: checkpoint saved at step 5: {part / 'checkpoints' / 'step_0000005'}" in stopped.stdout
    assert sorted(p.name for p in (part / "checkpoints").glob("step_*")) == ["step_0000005"]
    # The resume: the same two ranks with torchrun's environment, forked (run_ranks) — torchrun's part was the stop.
    run_ranks(tmp_path, 2, f"resume={part}", cache_dir=tiny_data_cache, faults=AOT_EAGER)  # compiled, as saved
    assert {s: r["loss"] for s, r in train_rows(part).items()} == {s: r["loss"] for s, r in train_rows(ddp_run).items()}
    assert val_losses(part) == val_losses(ddp_run)
    wf, wp = weights(ddp_run, 12), weights(part, 12)
    assert all(torch.equal(wf[k], wp[k]) for k in wf)


def test_a_finished_run_destroys_the_process_group_on_every_rank(ddp_run):
    """train.py tears torchrun's process group down when a run ends normally too, not only on an error (the
    hung-rank test): each rank's teardown found the group up and left it gone."""
    (log,) = [p / TEARDOWN_LOG for p in ddp_run.parents if (p / TEARDOWN_LOG).exists()]
    assert sorted(log.read_text().splitlines()) == ["0 True False", "1 True False"]


def test_only_rank_zero_writes_the_metrics(ddp_run):
    """Both ranks run the logger (the loss is all-reduced), one writes: each step has exactly one row."""
    rows = read_metrics(ddp_run)
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 13))
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [6, 12]


def test_each_rank_draws_its_own_dropout_and_resumes_its_own_stream(tmp_path, tiny_data_cache):
    """Under torchrun each rank seeds dropout from (seed, rank): their masks differ (the same masks on
    every rank would correlate the replicas' noise), and a resume restores every rank's own generator —
    a 2-rank run with dropout, stopped at step 3 and resumed, equals the uninterrupted one bitwise. With Muon,
    the default's optimizer (its momentum and AdamW's moments for the rest), where the SIGTERM test resumes AdamW."""
    dropout = [
        "trainer.precision=fp32",
        "model.dropout=0.1",
        "trainer.max_steps=6",
        "trainer.log_interval=1",
        "trainer.eval_interval=6",
        "trainer.ckpt_interval=3",
        "trainer.micro_batch_size=2",
        "optim=muon",
    ]
    run_ranks(tmp_path / "straight", 2, *dropout, cache_dir=tiny_data_cache)
    (straight,) = run_dirs(tmp_path / "straight")
    assert yaml.safe_load((straight / "config.yaml").read_text())["optim"]["name"] == "muon"
    rng = torch.load(straight / "checkpoints" / "step_0000003" / "rng.pt", weights_only=True)
    assert len(rng["ranks"]) == 2 and not torch.equal(rng["ranks"][0]["torch"], rng["ranks"][1]["torch"])
    run_ranks(tmp_path / "resumed", 2, *dropout, "trainer.stop_at_step=3", cache_dir=tiny_data_cache)
    (part,) = run_dirs(tmp_path / "resumed")
    run_ranks(tmp_path / "resumed", 2, f"resume={part}", cache_dir=tiny_data_cache)
    assert {s: r["loss"] for s, r in train_rows(part).items()} == {
        s: r["loss"] for s, r in train_rows(straight).items()
    }
    wa, wb = weights(straight, 6), weights(part, 6)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_fsdp_on_cuda_computes_and_gathers_in_bf16_and_reduces_in_fp32(monkeypatch):
    """The FSDP2 mixed-precision policy (a loose tolerance would pass without it): with bf16 on a CUDA
    device every block and the root are sharded with bf16 params and fp32 gradient reduction; fp32 runs
    and CPU runs (where gloo reduces and autocast alone sets the compute dtype) get no policy."""
    import torch.distributed.fsdp as fsdp
    from model_helpers import tiny_model_config

    calls = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kwargs: calls.append((module, kwargs)))
    model = Transformer(tiny_model_config())
    cuda = D.DistInfo(device=torch.device("cuda", 0))
    root = CausalLMLoss(model)
    D.wrap_model(root, model.layers, "fsdp", cuda, "bf16")
    assert [m for m, _ in calls] == [*model.layers, root]
    for _, kwargs in calls:
        policy = kwargs["mp_policy"]
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    for device, precision in ((torch.device("cuda", 0), "fp32"), (torch.device("cpu"), "bf16")):
        calls.clear()
        D.wrap_model(CausalLMLoss(model), model.layers, "fsdp", D.DistInfo(device=device), precision)
        assert calls and all("mp_policy" not in kwargs for _, kwargs in calls)


def test_fsdp_checkpoint_resumes_on_a_different_world_size(tmp_path, reference, tiny_data_cache):
    """FSDP2 on 2 ranks to step 6 equals one process; its checkpoint (full weights, optimizer state keyed
    by name) resumed in ONE process with micro batch 4 — the same global batch — continues the very same
    run to step 12: losses, validation and weights as if it had never stopped, and it loads for generation."""
    from model.generate import generate

    proc = run_ranks(
        tmp_path,
        2,
        *TWO_RANKS,
        *COMPILED,
        "trainer.parallel=fsdp",
        "trainer.stop_at_step=6",
        cache_dir=tiny_data_cache,
        faults=AOT_EAGER,
    )
    assert "parallel=fsdp, compile: trainer.compile=true" in proc.stdout and "torch.compile failed" not in proc.stderr
    (run,) = run_dirs(tmp_path)
    assert_same_run(run, reference, steps=list(range(1, 7)))
    proc = run_train(
        tmp_path, f"resume={run}", "trainer.micro_batch_size=4", "trainer.compile=false", cache_dir=tiny_data_cache
    )
    assert "warning: resuming a 2-process run on 1" in proc.stdout
    assert json.loads((run / "checkpoints" / "step_0000012" / "state.json").read_text())["step"] == 12
    assert sorted(train_rows(run)) == list(range(1, 13))
    assert_same_run(run, reference, steps=list(range(7, 13)))
    model, tokenizer, _ = load_model(str(run / "checkpoints" / "step_0000012"))
    assert len(generate(model, tokenizer, ["ROMEO:"], max_new_tokens=8, temperature=0.0)[0]) > 0


# ---- no_sync: one all-reduce per optimizer step, whatever the accumulation ----------------------------


@pytest.fixture
def one_rank_group():
    """A real gloo process group of one rank in this process (DDP needs one), destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield D.DistInfo()
    finally:
        dist.destroy_process_group()


class _Batches:
    def __init__(self, vocab_size):
        self.vocab_size = vocab_size

    def get(self, step, micro):
        ids = torch.randint(0, self.vocab_size, (2, 9), generator=torch.Generator().manual_seed(100 * step + micro))
        return ids[:, :-1], ids[:, 1:]


def test_accumulation_all_reduces_once_per_optimizer_step(one_rank_group):
    """DDP's gradient buckets are all-reduced on the last micro-step only (`no_sync` on the others):
    4 micro-steps launch exactly as many all-reduces as 1. Counted by a comm hook around DDP's own."""
    from model_helpers import tiny_model_config
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    launched = []

    def counting_hook(state, bucket):
        launched.append(bucket.index())
        return allreduce_hook(None, bucket)

    torch.manual_seed(0)
    model = Transformer(tiny_model_config())
    ddp = D.wrap_model(CausalLMLoss(model), model.layers, "ddp", one_rank_group, "fp32")
    ddp.register_comm_hook(None, counting_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    per_step = []
    for step, accum in enumerate([1, 4, 2, 1]):
        launched.clear()
        train_step = TrainStep(
            ddp, _Batches(model.cfg.vocab_size), [optimizer], contextlib.nullcontext, accum, 1.0, torch.device("cpu")
        )
        loss, _ = train_step(step)
        assert math.isfinite(loss.item())
        per_step.append(len(launched))
    assert per_step[0] > 0 and per_step == [per_step[0]] * 4, per_step


# ---- a hung rank: the collective timeout fails the run, the group is torn down ------------------------


def test_a_hung_rank_fails_the_run_within_the_timeout_and_tears_down(tmp_path, tiny_data_cache):
    """Rank 1 stops answering (SIGSTOP) mid-run: rank 0 must not hang in its next collective but fail
    after trainer.dist_timeout_s, saying so, and destroy its process group on the way out; torchrun then
    reports the job failed."""
    timeout_s, log = 5, tmp_path / "teardown.log"  # well above a tiny step, so only the hang can trip it
    args = tiny_args(
        tmp_path,
        [
            "trainer.max_steps=100000",
            "trainer.log_interval=1",
            "trainer.eval_interval=100000",
            "trainer.ckpt_interval=100000",
            f"trainer.dist_timeout_s={timeout_s}",
        ],
        tiny_data_cache,
    )
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(REPO / "tests" / "fault_injection.py"),
        json.dumps({"teardown_log": str(log)}),
    ]
    proc = launch(launcher, args, popen=True)
    rank1 = None
    try:
        wait_for_step(tmp_path / "outputs", 3, proc)
        rank0, rank1 = torchrun_worker(proc.pid, 0), torchrun_worker(proc.pid, 1)
        os.kill(rank1, signal.SIGSTOP)
        hung_at = time.time()
        while running(rank0) and time.time() - hung_at < timeout_s + 60:
            time.sleep(0.1)
        waited = time.time() - hung_at
        os.kill(rank1, signal.SIGKILL)  # what a scheduler does with a hung job; torchrun would wait 30 s more
        out, err = proc.communicate(timeout=60)
    finally:
        if rank1 is not None and running(rank1):
            os.kill(rank1, signal.SIGKILL)
        proc.kill()
    assert waited < timeout_s + 30, f"rank 0 still running {waited:.0f} s after rank 1 hung"
    assert proc.returncode != 0
    assert "Timed out" in err or "timed out" in err, err[-3000:]
    assert log.read_text().split("\n")[0] == "0 True False", log.read_text()  # rank 0 destroyed its group


def test_a_killed_rank_leaves_the_survivor_one_line_naming_the_intact_checkpoint(tmp_path, tiny_data_cache):
    """kill -9 of rank 1 mid-run: rank 0 stops at once and says that a peer died and which checkpoint is
    intact, in one `error:` line instead of gloo's "Connection reset by peer" traceback."""
    args = tiny_args(
        tmp_path,
        [
            "trainer.max_steps=100000",
            "trainer.log_interval=1",
            "trainer.eval_interval=100000",
            "trainer.ckpt_interval=2",
        ],
        tiny_data_cache,
    )
    proc = launch(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"], args, popen=True
    )
    try:
        run = wait_for_step(tmp_path / "outputs", 5, proc)
        os.kill(torchrun_worker(proc.pid, 1), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1, err[-3000:]
    intact = sorted((run / "checkpoints").glob("step_*"))[-1]
    # gloo words it as the timing falls: "reset" when the peer's socket is torn down mid-read, "closed" after.
    found = re.search(r"lost contact with the other ranks \(([^)]*)\)", ours[0])
    said = found.group(1) if found else None
    assert said and D.peer_lost(RuntimeError(said), D.DistInfo(world_size=2)) == said, ours[0]  # gloo's own words
    assert ours[0] == (
        f"error: rank 0 lost contact with the other ranks ({said}): another process "
        f"of this torchrun job stopped (killed, or ended by an error of its own, which its line names); the last checkpoint, {intact}, is intact: resume "
        "from it"
    ), ours[0]
    assert not re.search(
        r'File ".*/(training|model|data|cli)/|File ".*/train.py"', err
    )  # no traceback through our code


def test_another_ranks_error_starts_a_line_of_its_own(tmp_path, tiny_data_cache):
    """Under torchrun every rank shares the terminal, and rank 0's progress bar has no newline: rank 1's
    `error:` line would be glued to it (`train: 50%|…|error: rank 1 lost contact…`) and `grep '^error:'` would
    miss it. A rank other than 0 starts its error on a new line (here one that fails before joining the group)."""
    args = tiny_args(tmp_path, ["data.path=/nonexistent/corpus.txt"], tiny_data_cache)
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "HYDRA_FULL_ERROR": "0",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
    }
    proc = forked.run([str(REPO / "train.py"), *args], env, REPO, timeout=120)  # a real process, ~3 s cheaper
    assert proc.returncode == 1 and "\nerror: " in "\n" + proc.stderr, proc.stderr[-2000:]
    line = next(i for i, text in enumerate(proc.stderr.split("\n")) if text.startswith("error: "))
    assert line > 0 and proc.stderr.split("\n")[line - 1] == "", proc.stderr  # a newline first: a line of its own


def test_ranks_that_compose_different_configs_stop_before_the_first_step_naming_the_keys(tmp_path, tiny_data_cache):
    """An override read from a rank's environment (issue 68: before, exit 0 with rank 1 on another schedule over the
    same averaged gradient, and config.yaml recording rank 0's only): every rank says the same one line, naming the
    key and both values, and nothing trains."""
    with pytest.raises(AssertionError) as failed:
        run_ranks(tmp_path, 2, "optim.warmup_steps=${oc.env:LOCAL_RANK}", cache_dir=tiny_data_cache)
    line = (
        "error: rank 1 composed another config than rank 0: optim.warmup_steps (1 there, 0 on rank 0); every rank "
        "must train the same config — pass the same overrides to each, none read from a rank's environment"
    )
    assert str(failed.value).count(line) == 2, str(failed.value)[-3000:]
    assert not list((tmp_path / "outputs").glob("*/*/metrics.jsonl"))


def test_the_config_check_names_the_first_differing_keys_of_the_first_differing_rank(monkeypatch):
    import training.distributed as D
    from training.cli import ConfigError, check_same_config

    texts = ["a: 1\nb: {c: 2}\n", "a: 1\nb: {c: 2}\n", "a: 3\nb: {c: 4, d: 5}\n"]
    monkeypatch.setattr(D, "gather_objects", lambda text, info: texts)
    with pytest.raises(ConfigError, match=r"^rank 2 composed another config than rank 0: a \(3 there, 1 on rank 0\), "):
        check_same_config(texts[0], None)
    monkeypatch.setattr(D, "gather_objects", lambda text, info: texts[:2])
    check_same_config(texts[0], None)  # the same everywhere: silence
