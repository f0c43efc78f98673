"""What trust costs: saving a checkpoint, and hashing it against its manifest on load, per model size.

Usage: python -m dev.bench checkpoint [--models cpu,25m,125m] [--repeats 3]
Each model's real weights and a full AdamW state (two moments per parameter, as after the first step)
are saved with save_checkpoint — which writes manifest.json (SHA-256 of every file) — into a temporary
folder; then the files are verified as every loader verifies them. The verify time per GB is the
number BENCHMARKS.md quotes: how much `--no-verify` / `verify_checkpoint=false` would save.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from model import Transformer
from training.checkpoint import (
    CHECKPOINTS,
    TOKENIZER,
    damage,
    read_manifest,
    save_checkpoint,
)
from training.cli import compose_train_config, description


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--models", default="cpu,25m,125m", help="model config names (configs/model/)")
    p.add_argument("--repeats", type=int, default=3, help="timed saves and verifications per model (median)")
    return p.parse_args(argv)


def measure(model_name: str, repeats: int) -> dict:
    cfg, _ = compose_train_config([f"model={model_name}", "data.vocab_size=4096"])
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    optimizer = torch.optim.AdamW(model.parameters())
    state = optimizer.state_dict()
    state["state"] = {
        i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        for i, p in enumerate(model.parameters())
    }
    saves, verifies = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            start = time.perf_counter()
            tokenizer, ckpts = {TOKENIZER: b"{}"}, Path(tmp) / CHECKPOINTS
            ckpt = save_checkpoint(ckpts, i, model.state_dict(), cfg.model, tokenizer, {"step": i}, "", state, 1)
            saves.append(time.perf_counter() - start)
            start = time.perf_counter()
            assert damage(ckpt) is None
            verifies.append(time.perf_counter() - start)
        size = sum(entry["bytes"] for entry in read_manifest(ckpt).values())
    save_s, verify_s = statistics.median(saves), statistics.median(verifies)
    return {
        "model": model_name,
        "params": sum(p.numel() for p in model.parameters()),
        "gb": size / 1e9,
        "save_s": save_s,
        "verify_s": verify_s,
        "verify_s_per_gb": verify_s / (size / 1e9),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = [measure(name, args.repeats) for name in args.models.split(",")]
    print(
        "| model | parameters | checkpoint | save (with manifest) | verify on load | verify per GB | "
        "verify / save |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for r in rows:
        print(
            f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['gb'] * 1e3:.2f} MB | {r['save_s']:.2f} s | "
            f"{r['verify_s']:.2f} s | {r['verify_s_per_gb']:.2f} s | {r['verify_s'] / r['save_s']:.0%} |"
        )
    return 0
