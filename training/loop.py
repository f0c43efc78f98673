"""The training loop: build the run, then one top-to-bottom loop of named steps.

    while not should_stop():   # agreed by every rank: end of schedule, stop_at_step, or a signal
        train_step()           # micro-batches, clip, skip the update if anything is non-finite
        maybe_log()            # one host sync per log interval: losses, skipped steps, throughput
        maybe_eval()           # validation loss / bpb, the `best` checkpoint
        maybe_save()           # periodic checkpoint (refuses non-finite weights)
"""
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from data import TrainBatches, eval_windows
from data.tokenizer import read_special_tokens
from model import Transformer
from training.runtime import distributed as D
from training import report
from training.checkpoint import Checkpointer, load_training_state, move_aside_later_checkpoints, read_weights, restore_rng
from training.checkpoint.state_dicts import load_full_state
from training.config import TrainConfig
from training.evaluation import evaluate, full_split_windows, sample_text
from training.loss import CausalLMLoss
from training.runtime.memory import peak_memory_bytes
from training.runtime.mfu import peak_flops
from training.optim import apply_schedule, build_optimizers
from training.precision import autocast_context, resolve_precision
from training.logger import RunLogger
from training.runtime.signals import StopFlag, signal_name
from training.step import NonFiniteRecord, train_step


@dataclass
class RunSpec:
    """What train.py resolved: the typed config, where the run lives, and where it resumes from."""
    cfg: TrainConfig
    run_dir: Path
    config_yaml: str  # the resolved config, saved next to every checkpoint
    resume_ckpt: Optional[Path] = None
    multirun: bool = False  # one job of a `-m` sweep


@dataclass
class Outcome:
    step: int
    last_eval: Optional[dict]
    signum: Optional[int]  # the signal that stopped the run (exit status 128 + signum)
    checkpoint: Optional[Path]
    tokens_run: int  # trained by this process (a resume counts from its checkpoint)
    wall_s: float  # this process's loop, evals and checkpoints included
    best_step: Optional[int]
    best_bpb: float
    skipped_steps: int


@dataclass
class Counters:
    """Where the run is; the part that goes into state.json is what a resume needs."""
    step: int = 0
    tokens_seen: int = 0
    elapsed_before: float = 0.0  # training seconds of the runs this one resumes
    skipped_steps: int = 0  # non-finite steps whose update was skipped, over the whole run
    skipped_since_log: int = 0
    first_skipped_since_log: int = -1
    best_bpb: float = math.inf
    best_step: Optional[int] = None
    epoch_warned: bool = False
    compile_s_reported: float = 0.0
    steps_timed: int = 0  # steps since the throughput clock was last restarted (eval/save restart it)
    pending: list = field(default_factory=list)  # loss tensors (on the device) since the last log


@dataclass
class Parts:
    """What the loop trains with: the model, the loss module (wrapped for DDP/FSDP, maybe compiled)
    and its optimizers, plus the precision and compile decisions and why they were taken."""
    raw_model: torch.nn.Module  # the bare Transformer: checkpoints, hooks, samples
    loss_module: torch.nn.Module  # CausalLMLoss, wrapped for DDP/FSDP2
    compute_loss: object  # loss_module, or its compiled version: what steps and evals call
    optimizers: list
    autocast: object
    precision: str
    parallel: str
    notes: tuple  # (precision why, compile note) for the header


def build(cfg: TrainConfig, info: D.DistInfo, say) -> Parts:
    """Model, loss and optimizers; the same initial weights on every rank (seeded before the build)."""
    torch.manual_seed(cfg.seed)
    raw_model = Transformer(cfg.model).to(info.device)
    precision, precision_why = resolve_precision(cfg.trainer.precision, info.device)
    parallel = D.resolve_parallel(cfg.trainer.parallel, info.world_size)
    loss_module = D.wrap_model(CausalLMLoss(raw_model), raw_model.layers, parallel, info, precision)
    optimizers = build_optimizers(loss_module, cfg.optim, info.device.type)
    compute_loss, compile_note = loss_module, "off: trainer.compile=false"
    if cfg.trainer.compile != "false":  # imported only when used: torch._dynamo costs seconds to import
        from training.compile import CompiledLoss, resolve_compile
        compiled, why = resolve_compile(cfg.trainer.compile, info.device)
        # Model + loss compiled as one graph, used by training and evaluation alike; falls back to eager.
        compute_loss = CompiledLoss(loss_module, warn=say) if compiled else loss_module
        compile_note = why if compiled else f"off: {why}"
    return Parts(raw_model, loss_module, compute_loss, optimizers, autocast_context(precision, info.device),
                 precision, parallel, (precision_why, compile_note))


def data_views(cfg: TrainConfig, data, info: D.DistInfo) -> tuple:
    """(training batches, this rank's validation windows)."""
    seq_len = cfg.trainer.seq_len
    batches = TrainBatches(data.train_tokens(), seq_len, cfg.trainer.micro_batch_size, cfg.seed,
                           info.rank, info.world_size)
    if cfg.trainer.num_eval_windows is None:  # every token of the split, each scored once
        windows = full_split_windows(data.val_tokens(), seq_len, data.meta["eos_id"], rank=info.rank,
                                     world_size=info.world_size)
    else:
        windows = eval_windows(data.val_tokens(), seq_len, cfg.trainer.num_eval_windows, info.rank, info.world_size)
    return batches, windows


def train(run: RunSpec, info: D.DistInfo, data) -> Outcome:
    cfg, say = run.cfg, (print if info.is_main else (lambda *a, **k: None))
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    parts = build(cfg, info, say)
    raw_model, compute_loss, optimizers, autocast = parts.raw_model, parts.compute_loss, parts.optimizers, parts.autocast
    counters = Counters()
    # Dropout differs per rank (each rank sees other rows); batches never touch this generator.
    torch.manual_seed(int(np.random.SeedSequence([cfg.seed, info.rank]).generate_state(1)[0]))
    if run.resume_ckpt is not None:
        restore(run, info, raw_model, optimizers, counters, say)
    tokens_before = counters.tokens_seen
    batches, windows = data_views(cfg, data, info)
    tokens_per_step = cfg.trainer.micro_batch_size * cfg.trainer.seq_len * cfg.trainer.grad_accum_steps \
        * info.world_size
    peak, peak_source = peak_flops(info.device, parts.precision, cfg.trainer.peak_tflops)
    say(report.header(run, cfg, raw_model, data, info, tokens_per_step, parts, peak, peak_source, counters.step))
    log = RunLogger(run.run_dir, cfg.logger, cfg.run_name, report.config_dict(run.config_yaml), info.is_main,
                    resume_step=counters.step if run.resume_ckpt else None)
    saver = Checkpointer(run, info, raw_model, parts.loss_module, optimizers, data.tokenizer_path)
    record = NonFiniteRecord.on(info.device)
    flops_per_token = raw_model.flops_per_token(cfg.trainer.seq_len)
    end = min(cfg.trainer.max_steps, cfg.trainer.stop_at_step or cfg.trainer.max_steps)

    # ---- loop ----------------------------------------------------------------------------------------
    stop, last_eval, signum = StopFlag(), None, None
    progress = report.progress_bar(info.is_main, counters.step, cfg.trainer.max_steps)
    # Throughput clock: wall time minus compile time (compiling is not training).
    clock = lambda: time.time() - getattr(compute_loss, "compile_seconds", 0.0)  # noqa: E731
    t0, t_log = time.time(), clock()
    parts.loss_module.train()
    if compute_loss is not parts.loss_module:
        say("compile: the first training step and the first eval compile model + loss (up to a minute or two "
            "on a CPU); the progress bar waits meanwhile")
    try:
        while True:
            signum = should_stop(stop, counters.step, end, info)
            if signum is not None or counters.step >= end:
                break
            lr = apply_schedule(optimizers, counters.step, cfg.optim, cfg.trainer.max_steps)
            loss, grad_norm = train_step(compute_loss, batches, counters.step, cfg.trainer.grad_accum_steps,
                                         cfg.optim.grad_clip, optimizers, record, info.device, autocast)
            counters.step += 1
            counters.tokens_seen += tokens_per_step
            counters.pending.append(loss)
            counters.steps_timed += 1
            progress.update(1)
            last = counters.step == end
            log_now, eval_now = counters.step % cfg.trainer.log_interval == 0, counters.step % cfg.trainer.eval_interval == 0
            save_now = counters.step % cfg.trainer.ckpt_interval == 0
            if log_now or eval_now or save_now or last:  # never evaluate or save past an unchecked step
                check_steps(counters, record, cfg, saver)
            if log_now or last:
                elapsed = counters.elapsed_before + time.time() - t0
                compile_s = getattr(compute_loss, "compile_seconds", 0.0)
                maybe_log(counters, grad_norm, lr, elapsed, clock() - t_log, tokens_per_step,
                          flops_per_token, peak, data, cfg, info, log, progress, compile_s)
                t_log, counters.steps_timed = clock(), 0
            if eval_now or last:
                last_eval = maybe_eval(compute_loss, raw_model, windows, cfg, autocast, data, info, log, progress,
                                       counters, saver, parts.parallel)
                t_log, counters.steps_timed = clock(), 0  # eval time is not training throughput
            if save_now or last:
                saver.save(counters)
                t_log, counters.steps_timed = clock(), 0
        if signum is not None and saver.saved_step != counters.step:  # not twice if it just saved
            saver.save(counters)
    finally:
        progress.close()
        stop.restore()
        log.close()
    if signum is not None:
        say(f"\n{signal_name(signum)}: checkpoint saved at step {counters.step}: {saver.last_path}\n"
            f"resume with: python train.py resume={run.run_dir}")
    return Outcome(counters.step, last_eval, signum, saver.last_path, counters.tokens_seen - tokens_before,
                   time.time() - t0, counters.best_step, counters.best_bpb, counters.skipped_steps)


def should_stop(stop: StopFlag, step: int, end: int, info: D.DistInfo) -> Optional[int]:
    """The signal number every rank stops for, or None. A signal may reach one rank only, or the
    ranks a moment apart: the max over ranks makes them all stop (and save) at the same step."""
    (signum,) = D.agree_max([stop.signum or 0], info)
    return signum or None


def restore(run: RunSpec, info, raw_model, optimizers, counters: Counters, say) -> None:
    """Model, optimizer, RNG and counters from the checkpoint being resumed."""
    cfg = run.cfg
    state, optim_state, rng = load_training_state(run.resume_ckpt)
    load_full_state(raw_model, optimizers, read_weights(raw_model, run.resume_ckpt), optim_state)
    if not restore_rng(rng, info.rank, info.world_size):  # last: nothing after this may draw from it
        say("warning: the checkpoint holds no RNG state for this world size: dropout draws restart from the seed")
    counters.step, counters.tokens_seen = state["step"], state["tokens_seen"]
    counters.elapsed_before = state["elapsed_s"]
    counters.skipped_steps = state.get("skipped_steps", 0)
    counters.best_bpb = state.get("best_val_bpb") or math.inf
    counters.best_step = state.get("best_step")
    if counters.step >= cfg.trainer.max_steps:
        raise ValueError(f"{run.resume_ckpt} is already at step {counters.step} = trainer.max_steps; pass a larger "
                         "trainer.max_steps to train further (the schedule then stretches to it)")
    if info.is_main:  # the branch this resume abandons must not be picked by a later resume or keep_last
        moved = move_aside_later_checkpoints(run.run_dir / "checkpoints", counters.step)
        if moved:
            say(f"resume: moved {len(moved)} later checkpoint(s) of the abandoned branch to {moved[0].parent}")
    if state.get("world_size", 1) != info.world_size:
        say(f"warning: resuming a {state['world_size']}-process run on {info.world_size}: each step's global "
            f"batch changes with the world size; adjust trainer.micro_batch_size to keep tokens per step")


def check_steps(counters: Counters, record: NonFiniteRecord, cfg, saver) -> None:
    """Read the device-side record of skipped steps and stop if it says so (note: a CPU-GPU sync
    point — at log, eval and save steps only, so nothing is evaluated or saved past a failed step)."""
    nonfinite = record.read()
    counters.skipped_steps += nonfinite["skipped"]
    counters.skipped_since_log += nonfinite["skipped"]
    if counters.first_skipped_since_log < 0:
        counters.first_skipped_since_log = nonfinite["first_bad"]
    report.check_nonfinite(nonfinite, cfg.trainer.skip_nonfinite_steps, saver.last_good(), counters.step)


def maybe_log(counters: Counters, grad_norm, lr, elapsed, interval_s, tokens_per_step, flops_per_token, peak,
              data, cfg, info, log, progress, compile_s: float) -> None:
    """One host sync per interval: mean loss over ranks, skipped steps, throughput, epochs, memory."""
    losses = D.all_reduce_mean(torch.stack(counters.pending), info).tolist()
    counters.pending = []
    skipped, first_skipped = counters.skipped_since_log, counters.first_skipped_since_log
    counters.skipped_since_log, counters.first_skipped_since_log = 0, -1
    finite = [loss for loss in losses if math.isfinite(loss)]
    new_compile_s, counters.compile_s_reported = compile_s - counters.compile_s_reported, compile_s
    tps = counters.steps_timed * tokens_per_step / max(interval_s, 1e-9)
    epochs = counters.tokens_seen / (data.meta["train_tokens"] or 1)
    row = {"kind": "train", "step": counters.step, "loss": sum(finite) / len(finite) if finite else math.nan,
           "lr": lr, "grad_norm": grad_norm.item(), "tokens": counters.tokens_seen, "epochs": epochs,
           "elapsed_s": elapsed, "tokens_per_s": tps, "mfu": tps * flops_per_token / (peak * info.world_size),
           "skipped_steps": skipped, "peak_memory_gb": peak_memory_bytes(info.device) / 2 ** 30,
           "compile_s": compile_s}
    log.log(row)
    if new_compile_s > 0.5 and info.is_main:
        progress.write(f"compile: {compile_s:.0f} s so far (step {counters.step}); compiled graphs are reused")
    if skipped:
        progress.write(f"step {counters.step}: skipped {skipped} non-finite step(s) (first at step "
                       f"{first_skipped}); {counters.skipped_steps} in total") if info.is_main else None
    if epochs > cfg.trainer.epoch_warning and not counters.epoch_warned:
        counters.epoch_warned = True
        progress.write(report.epoch_warning(epochs, data.meta["train_tokens"])) if info.is_main else None
    progress.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{lr:.1e}", tok_s=f"{tps:,.0f}", ep=f"{epochs:.2f}")


def maybe_eval(compute_loss, raw_model, windows, cfg, autocast, data, info, log, progress, counters, saver,
               parallel) -> dict:
    """Validation at this step; a new lowest bpb becomes checkpoints/best."""
    ev = evaluate(compute_loss, raw_model, windows, cfg, autocast, data.meta, info, eager_loss=saver.loss_module)
    log.log(report.eval_row(counters.step, counters.tokens_seen, ev))
    if info.is_main:
        progress.write(f"step {counters.step}: val loss {ev['val_loss']:.4f} | bpb {ev['val_bpb']:.4f}")
        if cfg.trainer.sample_tokens > 0 and parallel != "fsdp":
            eos = read_special_tokens(data.dir)["eos"]
            progress.write(sample_text(raw_model, data.tokenizer(), cfg, autocast, eos_token=eos))
    if math.isfinite(ev["val_bpb"]) and ev["val_bpb"] < counters.best_bpb:
        counters.best_bpb, counters.best_step = ev["val_bpb"], counters.step
        if cfg.trainer.keep_best:
            saver.save_best(counters)
    return ev
