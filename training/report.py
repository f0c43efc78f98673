"""What the user sees: progress bar, metric rows, the non-finite-loss stop, and the final summary."""
import math
import sys

from tqdm import tqdm


class NonFiniteLoss(RuntimeError):
    pass


def progress_bar(enabled: bool, start: int, total: int):
    return tqdm(total=total, initial=start, disable=not enabled, desc="train", unit="step",
                dynamic_ncols=True, file=sys.stdout, mininterval=1.0)


def check_finite(losses: list, ckpt_dir) -> None:
    """losses = [(step, loss)]; raise at the first NaN/inf with the exact step."""
    for step, value in losses:
        if not math.isfinite(value):
            raise NonFiniteLoss(f"loss became {value} at step {step}; the last good checkpoint is kept in "
                                f"{ckpt_dir} — lower optim.lr, raise optim.warmup_steps or check the data")


def eval_row(step: int, tokens: int, ev: dict) -> dict:
    row = {"kind": "eval", "step": step, "tokens": tokens,
           **{k: v for k, v in ev.items() if k != "act_rms"}}
    for name, values in ev.get("act_rms", {}).items():
        row[f"rms_{name}"] = values  # one value per layer
    return row


def summary(ev: dict, step: int, tokens: int, wall_s: float, ckpt_path, run_dir) -> str:
    return "\n".join([
        "",
        f"done: {step} steps, {tokens:,} tokens in {wall_s / 60:.1f} min ({tokens / max(wall_s, 1e-9):,.0f} tokens/s)",
        f"final val loss {ev['val_loss']:.4f} | perplexity {ev['val_ppl']:.2f} | bits per byte {ev['val_bpb']:.4f}",
        f"checkpoint: {ckpt_path}",
        f"metrics:    {run_dir}/metrics.jsonl",
        f"generate:   python scripts/generate.py {ckpt_path} --prompt 'ROMEO:' --max-new-tokens 200",
    ])
