"""What a run trains with, before its first step: the model, the loss module (wrapped for DDP/FSDP2,
maybe compiled), the optimizers, the precision (a resume keeps its run's); and the data it reads. A resume's
weights, optimizer state, RNG and RunState are put back by training/checkpoint/resume.py."""
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from data import SAMPLERS, eval_windows, windows_per_epoch
from model import Transformer
from model import attention as A
from model.flops import matmul_shapes
from training.checkpoint.init_from import InitFrom
from training.checkpoint.resume import Resume
from training.config import TrainConfig
from training.evaluation import full_split_windows
from training.loss import CausalLMLoss
from training.optim import build_optimizers
from training.precision import autocast_context, enable_tf32, resume_precision
from training.runtime import distributed as D


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


def matmul_attention_warning(cfg: TrainConfig, device: torch.device, precision: str) -> Optional[str]:
    """A warning when model.attention_kernel=matmul is forced where it compiles to NaN gradients (model/attention.py
    compiled_matmul_attention_is_finite_here): else the run's first step stops with advice about the lr."""
    if (cfg.model.attention_kernel == "matmul" and device.type == "cpu" and precision == "bf16"
            and cfg.trainer.compile != "false" and not A.compiled_matmul_attention_is_finite_here()):
        return ("warning: model.attention_kernel=matmul, compiled in bf16 on this CPU (AMX tiles), gives NaN gradients "
                "with torch 2.13's inductor (docs/training.md, \"Attention kernel\"): use model.attention_kernel=auto "
                "or sdpa")
    return None


def build(cfg: TrainConfig, info: D.DistInfo, say, resume: Optional[Resume] = None,
          init: Optional[InitFrom] = None) -> Parts:
    """Model, loss and optimizers; the same initial weights on every rank (seeded before the build, or a
    checkpoint's: init_from). A resume keeps the precision its run trained in (training/precision.py's
    resume_precision says when it cannot); its weights are put back later, into the wrapped model."""
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    precision, precision_why, warning = resume_precision(cfg.trainer.precision, info.device,
                                                         resume.precision if resume else None,
                                                         resume.step if resume else 0, run_matmul_shapes(cfg))
    for line in (warning, matmul_attention_warning(cfg, info.device, precision)):
        if line:
            say(line)
    if enable_tf32(info.device, cfg.trainer.tf32) and precision == "fp32":
        precision_why += "; matmuls on TF32 tensor cores (trainer.tf32)"
    torch.manual_seed(cfg.seed)
    raw_model = Transformer(cfg.model).to(info.device)
    if init is not None and resume is None:  # before wrapping: FSDP2 shards what it finds, DDP broadcasts it
        init.load(raw_model)
    parallel = D.resolve_parallel(cfg.trainer.parallel, info.world_size)
    chunk_above = {"auto": "auto", "true": 0, "false": None}[cfg.trainer.chunked_loss]
    loss_module = D.wrap_model(CausalLMLoss(raw_model, chunk_above), raw_model.layers, parallel, info, precision)
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
    batches = SAMPLERS[cfg.data.sampling](data.train_tokens(), seq_len, cfg.trainer.micro_batch_size, cfg.seed,
                                          info.rank, info.world_size, cfg.trainer.grad_accum_steps)
    if cfg.trainer.num_eval_windows is None:  # every token of the split, each scored once
        windows = full_split_windows(data.val_tokens(), seq_len, data.meta["eos_id"], rank=info.rank,
                                     world_size=info.world_size)
    else:
        windows = eval_windows(data.val_tokens(), seq_len, cfg.trainer.num_eval_windows, info.rank, info.world_size)
    return batches, windows


def planned_steps(cfg: TrainConfig, train_tokens: int, tokens_per_step: int) -> Optional[int]:
    """Where trainer.max_steps and trainer.max_epochs end the run — the first reached of those set — or None
    when neither is (a time budget alone decides). max_epochs becomes ceil(epochs × epoch_tokens ÷ tokens per
    step), at least one step: under data.sampling=epochs max_epochs passes over every window, under random
    epoch-equivalents of windows drawn with replacement. A time budget plans within this (training/budget.py)."""
    limits = [cfg.trainer.max_steps] if cfg.trainer.max_steps else []
    if cfg.trainer.max_epochs:
        limits.append(max(1, math.ceil(cfg.trainer.max_epochs * epoch_tokens(cfg, train_tokens) / tokens_per_step)))
    return min(limits) if limits else None


def length_limit(cfg: TrainConfig, train_tokens: int, tokens_per_step: int) -> str:
    """Which of trainer.max_steps and trainer.max_epochs ends the run (planned_steps), as the header says it:
    "4 passes (trainer.max_epochs=4)"; '' when neither is set."""
    t, steps = cfg.trainer, planned_steps(cfg, train_tokens, tokens_per_step)
    if steps is None:
        return ""
    if t.max_steps == steps or not t.max_epochs:
        return f"trainer.max_steps={steps}"
    unit = "passes over every window" if cfg.data.sampling == "epochs" else "epoch-equivalents of random windows"
    return f"{t.max_epochs:g} {unit} (trainer.max_epochs={t.max_epochs:g})"


def epoch_tokens(cfg: TrainConfig, train_tokens: int) -> int:
    """The tokens one epoch trains on: every window's targets under data.sampling=epochs (a true pass: windows
    per epoch × seq_len); the training split under random, so its epochs are epoch-equivalents (tokens drawn ÷
    training tokens)."""
    if cfg.data.sampling == "epochs":
        return windows_per_epoch(train_tokens, cfg.trainer.seq_len) * cfg.trainer.seq_len
    return train_tokens
