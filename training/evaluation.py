"""Evaluation in the training loop: validation loss, perplexity, bits per byte; eval-time samples."""
import math

import torch

from training import distributed as D
from training.activation_stats import activation_rms
from training.loss import IGNORE_INDEX
from training.scoring import Windows


@torch.no_grad()
def evaluate(compute_loss, raw_model, windows, cfg, autocast, meta, info, eager_loss=None) -> dict:
    """Loss over the validation windows of all ranks; perplexity; bits per byte.

    `compute_loss(input_ids, targets)` is the training loss module (compiled, DDP/FSDP-wrapped), so
    evaluation runs the very graph training runs. `windows` are this rank's share: a `Windows`
    (training/scoring.py; `full_split_windows` for trainer.eval_windows=all, every token once) or
    (N, seq_len + 1) token tiles (data/loader.py `eval_windows`). `meta` holds the validation
    split's token and UTF-8 byte counts. `raw_model` is the unwrapped model, for the activation-RMS
    hooks; they run through `eager_loss` (the uncompiled loss module: hooks inside a compiled graph
    would force a recompile), by default `compute_loss`.
    """
    if isinstance(windows, torch.Tensor):
        windows = Windows.from_tiles(windows)
    compute_loss.eval()
    loss_sum = torch.zeros((), device=info.device, dtype=torch.float64)
    n_tokens = torch.zeros((), device=info.device, dtype=torch.float64)
    batch = cfg.trainer.micro_batch_size
    for chunk in windows.batches(batch):
        inputs, targets = chunk.inputs.to(info.device), chunk.targets.to(info.device)
        n = len(chunk)
        if n < batch:  # pad the last partial batch to the compiled shape; -100 targets score nothing
            inputs = torch.cat([inputs, inputs[:1].expand(batch - n, -1)])
            targets = torch.cat([targets, torch.full_like(targets[:1], IGNORE_INDEX).expand(batch - n, -1)])
        scored = (targets != IGNORE_INDEX).sum().double()
        with autocast():
            mean = compute_loss(inputs, targets)  # mean over the scored targets
        # A batch that scores nothing (a rank's padding row under eval_windows=all) has mean 0/0.
        loss_sum += torch.where(scored > 0, mean.double() * scored, 0.0)
        n_tokens += scored
    loss = (D.all_reduce_mean(loss_sum, info) / D.all_reduce_mean(n_tokens, info)).item()
    # Bits per byte = nats/token ÷ ln 2 × tokens/byte: comparable across tokenizers and vocab sizes.
    # With eval_windows=all the windows score exactly val_tokens tokens, so this is Σ nats / ln 2 / val_bytes.
    out = {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0)),
           "val_bpb": loss / math.log(2) * meta["val_tokens"] / meta["val_bytes"]}
    if cfg.trainer.activation_rms:  # every rank runs it: under FSDP the forward has collectives
        first = next(windows.batches(batch))
        inputs, targets = first.inputs.to(info.device), first.targets.to(info.device)
        with autocast():
            out["act_rms"] = activation_rms(raw_model, inputs, lambda: (eager_loss or compute_loss)(inputs, targets))
    compute_loss.train()
    return out


def sample_text(raw_model, tokenizer, cfg, autocast, eos_token: str) -> str:
    """A short sample from trainer.sample_prompt; its own seeded generator leaves training RNG untouched."""
    from model.generate import generate
    raw_model.eval()
    with autocast():
        text = generate(raw_model, tokenizer, [cfg.trainer.sample_prompt], max_new_tokens=cfg.trainer.sample_tokens,
                        temperature=0.8, top_k=50, seed=cfg.seed, eos_token=eos_token)[0]
    raw_model.train()
    return "---- sample ----\n" + cfg.trainer.sample_prompt + text + "\n----------------"
