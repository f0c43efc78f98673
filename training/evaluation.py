"""Evaluation on the fixed validation windows (loss, perplexity, bits per byte) and eval-time samples."""
import math

import torch
import torch.nn.functional as F

from training import distributed as D
from training.activation_stats import activation_rms


@torch.no_grad()
def evaluate(model, raw_model, windows, cfg, autocast, meta, info) -> dict:
    """Loss over the fixed validation windows of all ranks; perplexity; bits per byte.

    `windows` (N, seq_len + 1) are this rank's share; `meta` holds the validation split's token and
    UTF-8 byte counts. `raw_model` is the unwrapped model, for the activation-RMS hooks.
    """
    model.eval()
    loss_sum = torch.zeros((), device=info.device)
    for chunk in windows.split(cfg.trainer.micro_batch_size):
        chunk = chunk.to(info.device)
        with autocast():
            logits = model(chunk[:, :-1])
        loss_sum += F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), chunk[:, 1:].reshape(-1),
                                    reduction="sum")
    n_tokens = torch.tensor(float(windows[:, 1:].numel()), device=info.device)
    loss = (D.all_reduce_mean(loss_sum, info) / D.all_reduce_mean(n_tokens, info)).item()
    # Bits per byte = nats/token ÷ ln 2 × tokens/byte: comparable across tokenizers and vocab sizes.
    out = {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0)),
           "val_bpb": loss / math.log(2) * meta["val_tokens"] / meta["val_bytes"]}
    if cfg.trainer.activation_rms:  # every rank runs it: under FSDP the forward has collectives
        with autocast():
            out["act_rms"] = activation_rms(raw_model, windows[: cfg.trainer.micro_batch_size, :-1].to(info.device))
    model.train()
    return out


def sample_text(raw_model, tokenizer, cfg, autocast) -> str:
    """A short sample from trainer.sample_prompt; its own seeded generator leaves training RNG untouched."""
    from model.generate import generate
    raw_model.eval()
    with autocast():
        text = generate(raw_model, tokenizer, [cfg.trainer.sample_prompt], max_new_tokens=cfg.trainer.sample_tokens,
                        temperature=0.8, top_k=50, seed=cfg.seed)[0]
    raw_model.train()
    return "---- sample ----\n" + cfg.trainer.sample_prompt + text + "\n----------------"
