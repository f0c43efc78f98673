"""Run directories as train.py leaves them (config.yaml, metrics.jsonl), written by hand with
known numbers, for the tests of analysis/ and scripts/compare_runs.py."""

import json
from pathlib import Path

import yaml

BPB_TO_LOSS = 1.7  # any fixed ratio: one tokenizer, so loss and bpb rank alike
RATES = [100.0, 1000.0, 1010.0, 1020.0]  # tokens/s per log interval: a slow first one, so mean ≠ median


STARTED = 1_800_000_000.0  # the wall-clock stamp of a written run's start


def write_run(
    root: Path,
    name: str,
    *,
    norm="rmsnorm",
    mlp="swiglu",
    seed=0,
    bpb=1.0,
    max_steps=4,
    last_step=None,
    rms=True,
    hidden_size=32,
    cache_dir="cache",
    lr=3e-3,
    extra_model=None,
    precision="bf16",
) -> Path:
    """A run directory as train.py leaves it: config.yaml and metrics.jsonl (evals at steps 2 and 4). precision:
    what its train rows record ("bf16+fp32": a resume switched half-way; None: rows from before they recorded it)."""
    run = root / name
    run.mkdir(parents=True)
    config = {
        "model": {
            "vocab_size": 64,
            "hidden_size": hidden_size,
            "n_layers": 2,
            "n_heads": 4,
            "n_kv_heads": None,
            "multiple_of": 16,
            "intermediate_size": None,
            "max_seq_len": 32,
            "norm": norm,
            "mlp": mlp,
            "qk_norm": False,
            **(extra_model or {}),
        },
        "data": {"source": "shakespeare", "vocab_size": 64, "cache_dir": cache_dir},
        "optim": {"lr": lr, "min_lr": lr / 10, "warmup_steps": 1},
        "trainer": {"max_steps": max_steps, "precision": "bf16", "device": "cpu"},
        "logger": {"wandb": "disabled", "tags": [f"norm={norm}"]},
        "seed": seed,
        "run_name": name,
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    rows, precisions = [], precision.split("+") if precision else []
    for step in range(1, (last_step or max_steps) + 1):
        # Stamped as metrics.jsonl rows are: the loop started at STARTED + 5 (after 5 s of start-up), 10 s a step.
        rows.append(
            {
                "kind": "train",
                "step": step,
                "loss": 3.0,
                "tokens": 100 * step,
                "elapsed_s": 10.0 * step,
                "time": STARTED + 5 + 10.0 * step,
                "tokens_per_s": RATES[(step - 1) % len(RATES)] + seed,
            }
        )
        if precisions:
            rows[-1]["precision"] = precisions[(step - 1) * len(precisions) // max_steps]
        if step % 2 == 0:
            final_bpb = bpb + (max_steps - step) * 0.5  # decreasing towards the given final value
            row = {
                "kind": "eval",
                "step": step,
                "tokens": 100 * step,
                "val_loss": BPB_TO_LOSS * final_bpb,
                "val_bpb": final_bpb,
                "time": STARTED + 5 + 10.0 * step + 2,
            }  # an eval takes 2 s
            if rms:
                row["rms_residual"] = [1.0 + seed, 2.0 * step]
            rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def write_variant(root: Path, bpbs, **kwargs) -> None:
    label = "_".join(str(v) for v in kwargs.values())
    for seed, bpb in enumerate(bpbs):
        write_run(root, f"{label}_seed{seed}", seed=seed, bpb=bpb, **kwargs)
