"""What trust costs: saving a checkpoint (real weights and a full AdamW state, as after the first step) with its
manifest (SHA-256 of every file), and verifying it against the manifest as every loader does, per model size (median
of 3). The verify time per GB is what `--no-verify` / `verify_checkpoint=false` would save."""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dev.bench import machine
from model import Transformer
from training.checkpoint import (
    CHECKPOINTS,
    TOKENIZER,
    damage,
    read_manifest,
    save_checkpoint,
)
from training.program import compose_train_config, description


def measure(model_name: str) -> dict:
    cfg, _ = compose_train_config([f"model={model_name}", "data.vocab_size=4096"])
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    state = torch.optim.AdamW(model.parameters()).state_dict()
    state["state"] = {
        i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        for i, p in enumerate(model.parameters())
    }
    saves, verifies = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, ckpts = {TOKENIZER: b"{}"}, Path(tmp) / CHECKPOINTS
        for i in range(3):
            t0 = time.perf_counter()
            ckpt = save_checkpoint(ckpts, i, model.state_dict(), cfg.model, tokenizer, {"step": i}, "", state, 1)
            t1 = time.perf_counter()
            problem = damage(ckpt)
            saves.append(t1 - t0)
            verifies.append(time.perf_counter() - t1)
            assert problem is None, problem
        size = sum(entry["bytes"] for entry in read_manifest(ckpt).values())
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "gb": size / 1e9,
        "save_s": statistics.median(saves),
        "verify_s": statistics.median(verifies),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--models", default="cpu,25m,125m", help="model config names (configs/model/)")
    args = p.parse_args(argv)
    print(f"{machine()}\n")
    print(
        "| model | parameters | checkpoint | save (with manifest) | verify on load | verify per GB | "
        "verify / save |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for name in args.models.split(","):
        r = measure(name)
        print(
            f"| {name} | {r['params'] / 1e6:.1f}M | {r['gb'] * 1e3:.2f} MB | {r['save_s']:.2f} s | "
            f"{r['verify_s']:.2f} s | {r['verify_s'] / r['gb']:.2f} s | {r['verify_s'] / r['save_s']:.0%} |"
        )
