"""What a run trains with, before its first step: the model, the loss module (wrapped for DDP/FSDP2,
maybe compiled), the optimizers, the precision; the data it reads; and, for a resume, the checkpoint's
weights, optimizer state, RNG and RunState."""
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from data import TrainBatches, eval_windows
from model import Transformer
from model.flops import matmul_shapes
from training.checkpoint import load_training_state, move_aside_later_checkpoints, read_weights, restore_rng
from training.checkpoint.state_dicts import load_full_state
from training.config import TrainConfig
from training.evaluation import full_split_windows
from training.loss import CausalLMLoss
from training.optim import build_optimizers
from training.precision import autocast_context, enable_tf32, resume_precision
from training.run_state import RunState, read_state
from training.runtime import distributed as D
from training.runtime.run_files import RunFiles


@dataclass
class Parts:
    """The model, the loss module and its optimizers, plus the precision and compile decisions and why."""
    raw_model: torch.nn.Module  # the bare Transformer: checkpoints, hooks, samples
    loss_module: torch.nn.Module  # CausalLMLoss, wrapped for DDP/FSDP2
    compute_loss: object  # loss_module, or its compiled version: what steps and evals call
    optimizers: list
    autocast: object  # a zero-argument factory of the run's autocast context
    precision: str  # bf16 | fp32
    parallel: str  # none | ddp | fsdp
    notes: tuple  # (precision why, compile note) for the header


def build(cfg: TrainConfig, info: D.DistInfo, say, resume_ckpt: Optional[Path] = None) -> Parts:
    """Model, loss and optimizers; the same initial weights on every rank (seeded before the build). A resume
    keeps the precision its run trained in (training/precision.py's resume_precision says when it cannot)."""
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    resumed = read_state(resume_ckpt) if resume_ckpt is not None else {}
    precision, precision_why, warning = resume_precision(cfg.trainer.precision, info.device, resumed.get("precision"),
                                                         resumed.get("step", 0), run_matmul_shapes(cfg))
    if warning:
        say(warning)
    if enable_tf32(info.device, cfg.trainer.tf32) and precision == "fp32":
        precision_why += "; matmuls on TF32 tensor cores (trainer.tf32)"
    torch.manual_seed(cfg.seed)
    raw_model = Transformer(cfg.model).to(info.device)
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
    # Dropout differs per rank (each rank sees other rows); batches never touch this generator.
    torch.manual_seed(int(np.random.SeedSequence([cfg.seed, info.rank]).generate_state(1)[0]))
    return Parts(raw_model, loss_module, compute_loss, optimizers, autocast_context(precision, info.device),
                 precision, parallel, (precision_why, compile_note))


def run_matmul_shapes(cfg: TrainConfig) -> list:
    """The weight matmuls of one micro-batch's forward, from a meta-device model (no memory, no RNG drawn)."""
    with torch.device("meta"):
        model = Transformer(cfg.model)
    return matmul_shapes(model, cfg.trainer.micro_batch_size * cfg.trainer.seq_len)


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


def planned_steps(cfg: TrainConfig, train_tokens: int, tokens_per_step: int) -> int:
    """trainer.max_steps, or what trainer.max_epochs makes of it (at least one step)."""
    if cfg.trainer.max_epochs is None:
        return cfg.trainer.max_steps
    return max(1, math.ceil(cfg.trainer.max_epochs * train_tokens / tokens_per_step))


def restore(run, info: D.DistInfo, parts: Parts, say, max_steps: int) -> RunState:
    """The RunState of the checkpoint being resumed, its weights, optimizer state and RNG loaded."""
    state_json, optim_state, rng = load_training_state(run.resume_ckpt)
    load_full_state(parts.raw_model, parts.optimizers, read_weights(parts.raw_model, run.resume_ckpt), optim_state)
    if not restore_rng(rng, info.rank, info.world_size):  # last: nothing after this may draw from it
        say("warning: the checkpoint holds no RNG state for this world size: dropout draws restart from the seed")
    state = RunState.from_json(state_json)
    state.precision = parts.precision  # what this process trains in (state.json says what the run trained in)
    trainer = run.cfg.trainer
    if not (state.budget_decided and trainer.time_budget):  # a budget's plans go on; else the config's end
        state.max_steps, state.budget_minutes, state.plans = max_steps, None, []
    if state.stopped_early and trainer.early_stopping and state.evals_since_best >= trainer.early_stopping:
        raise ValueError(f"{run.resume_ckpt} ended its run early at step {state.step} (no lower validation bpb in "
                         f"{state.evals_since_best} evaluations); to train on, resume with trainer.early_stopping=null "
                         "or a larger patience")
    state.stop_at, state.stopped_early = trainer.stop_at_step, False
    if state.step >= state.max_steps:
        what = "the end its time budget planned" if state.budget_decided else "trainer.max_steps"
        raise ValueError(f"{run.resume_ckpt} is already at step {state.step} = {what}; pass a larger "
                         "trainer.max_steps (and trainer.time_budget=null) to train further (the schedule then "
                         "stretches to it)")
    if info.is_main:  # the branch this resume abandons must not be picked by a later resume or keep_last
        moved = move_aside_later_checkpoints(RunFiles(run.run_dir).checkpoints, state.step)
        if moved:
            say(f"resume: moved {len(moved)} later checkpoint(s) of the abandoned branch to {moved[0].parent}")
    if state.world_size != info.world_size:
        say(f"warning: resuming a {state.world_size}-process run on {info.world_size}: each step's global "
            f"batch changes with the world size; adjust trainer.micro_batch_size to keep tokens per step")
    state.seed, state.world_size = run.cfg.seed, info.world_size  # what this process trains with
    return state
