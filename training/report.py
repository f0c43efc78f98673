"""What the user sees: the run header, progress bar, metric rows, the non-finite stop, and the final summary."""
import sys
from typing import Optional

import yaml
from tqdm import tqdm


class NonFiniteLoss(ValueError):
    """Training hit non-finite losses or gradients (the updates were skipped; nothing non-finite was saved)."""


def progress_bar(enabled: bool, start: int, total: int):
    return tqdm(total=total, initial=start, disable=not enabled, desc="train", unit="step",
                dynamic_ncols=True, file=sys.stdout, mininterval=1.0)


def config_dict(config_yaml: str) -> dict:
    return yaml.safe_load(config_yaml)


def header(run, cfg, raw_model, data, info, tokens_per_step, parts, peak, peak_source, start_step) -> str:
    counts = raw_model.param_counts()
    m = cfg.model
    return "\n".join([
        f"run dir: {run.run_dir}" + (f" (resuming {run.resume_ckpt})" if run.resume_ckpt else ""),
        f"model: {m.norm} + {m.mlp}, hidden_size {m.hidden_size}, intermediate_size {m.resolved_intermediate_size}, "
        f"{m.depth}, {counts['total'] / 1e6:.2f}M parameters (embedding {counts['embedding'] / 1e6:.2f}M, "
        f"attention {counts['attention'] / 1e6:.2f}M, mlp {counts['mlp'] / 1e6:.2f}M, norm {counts['norm'] / 1e3:.1f}K)",
        f"data: {data.meta['source']}: {data.meta['train_tokens']:,} train / {data.meta['val_tokens']:,} val tokens, "
        f"vocab {data.meta['vocab_size']}, cache {data.dir}",
        f"tokens per optimizer step: {cfg.trainer.micro_batch_size} micro batch × {cfg.trainer.seq_len} seq_len × "
        f"{cfg.trainer.grad_accum_steps} accumulation × {info.world_size} processes = {tokens_per_step:,}",
        f"{info.device}, {parts.precision} ({parts.notes[0]}), parallel={parts.parallel}, compile: {parts.notes[1]}",
        f"MFU peak {peak / 1e12:.2f} TFLOP/s ({peak_source}), steps {start_step}→{cfg.trainer.max_steps}",
    ])


def check_nonfinite(record: dict, tolerated: int, last_good, step: int) -> None:
    """Stop when the skipped-step record says so: any at all with tolerated=0, else `tolerated` in a row."""
    if not record["skipped"] and record["max_streak"] < max(tolerated, 1):
        return
    where = f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was written yet"
    advice = "lower optim.lr, raise optim.warmup_steps or check the data"
    if tolerated == 0:
        raise NonFiniteLoss(f"non-finite loss or gradient at step {record['first_bad']} (update skipped, weights "
                            f"unchanged); {where} — {advice}, or set trainer.skip_nonfinite_steps=N to skip such steps")
    if record["max_streak"] >= tolerated:
        raise NonFiniteLoss(f"{record['max_streak']} non-finite steps in a row (trainer.skip_nonfinite_steps="
                            f"{tolerated}) by step {step}; "
                            f"{where} — {advice}")


def epoch_warning(epochs: float, train_tokens: int) -> str:
    return (f"warning: {epochs:.1f} epochs over the {train_tokens:,}-token training split: later steps repeat "
            "data, so expect the validation loss to rise (checkpoints/best keeps the lowest); more data "
            "helps more than more steps")


def eval_row(step: int, tokens: int, ev: dict) -> dict:
    row = {"kind": "eval", "step": step, "tokens": tokens,
           **{k: v for k, v in ev.items() if k != "act_rms"}}
    for name, values in ev.get("act_rms", {}).items():
        row[f"rms_{name}"] = values  # one value per layer
    return row


def summary(ev: dict, step: int, tokens: int, wall_s: float, ckpt_path, run_dir, best_step: Optional[int] = None,
            best_bpb: Optional[float] = None, skipped: int = 0) -> str:
    lines = [
        "",
        f"done: {step} steps, {tokens:,} tokens in {wall_s / 60:.1f} min ({tokens / max(wall_s, 1e-9):,.0f} tokens/s)",
        f"final val loss {ev['val_loss']:.4f} | perplexity {ev['val_ppl']:.2f} | bits per byte {ev['val_bpb']:.4f}",
    ]
    if best_step is not None and best_step != step:
        lines.append(f"best val bits per byte {best_bpb:.4f} at step {best_step}: {run_dir}/checkpoints/best")
    if skipped:
        lines.append(f"skipped {skipped} non-finite step(s) (trainer.skip_nonfinite_steps)")
    lines += [
        f"checkpoint: {ckpt_path}",
        f"metrics:    {run_dir}/metrics.jsonl",
        f"generate:   python scripts/generate.py {ckpt_path} --prompt 'ROMEO:' --max-new-tokens 200",
    ]
    return "\n".join(lines)
