"""μP's coordinate check: activation RMS against width after each of a few training steps, SP and μP side
by side, for AdamW and Muon; prints the fitted slopes (0 = flat in width) and writes the figure.

Usage: python -m lab.coord_check [--widths 64,128,256,512,1024] [--steps 10] [--out coord_check.png]
       python -m lab.coord_check --as-trained   # the transfer runs' warmup, cosine, clipping, weight decay, 150 steps
Every option: --help. Width 1024 with Muon takes about a minute on one core (Newton–Schulz at that size).
"""

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from lab import SEARCH_PATH
from lab.mup.coord_check import ATTENTION_LOGITS, LAYERS, CoordSetup, coord_check
from lab.mup.plots import NAMES, plot_coord_check
from lab.mup.transfer import TransferSpec
from training.cli import compose_train_config, description, run


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--widths", default="64,128,256,512,1024", help="comma-separated hidden sizes")
    p.add_argument("--base-width", type=int, default=None, help="model.mup_base_width (default: the smallest width)")
    p.add_argument("--optimizers", default="adamw,muon", help="comma-separated: adamw, muon")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="updates per width (default 10; --as-trained: the transfer runs' trainer.max_steps)",
    )
    p.add_argument("--lr", type=float, default=1e-2, help="the peak lr (constant unless --as-trained)")
    p.add_argument(
        "--as-trained",
        action="store_true",
        help="train as the μP transfer runs do (configs/experiment/mup_transfer.yaml): its warmup, cosine to "
        "lr × 0.1, gradient clipping, weight decay and steps, instead of the raw update rule",
    )
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4, help="fixed across widths: head_dim grows with width")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("coord_check.png"))
    return p.parse_args(argv)


def setups(args) -> list:
    try:
        widths = tuple(sorted(int(w) for w in args.widths.split(",")))
    except ValueError:
        raise ValueError(f"--widths {args.widths!r}: give comma-separated integers, e.g. 64,128,256") from None
    optimizers = args.optimizers.split(",")
    if len(widths) < 2 or any(o not in ("adamw", "muon") for o in optimizers):
        raise ValueError("--widths needs at least two widths and --optimizers only adamw and muon")
    base = CoordSetup(
        widths=widths,
        base_width=args.base_width or widths[0],
        lr=args.lr,
        steps=args.steps or 10,
        n_layers=args.layers,
        n_heads=args.heads,
        seed=args.seed,
    )
    if args.as_trained:
        cfg, _ = compose_train_config([SEARCH_PATH, f"experiment={TransferSpec.experiment}"])
        o = cfg.optim
        base = dataclasses.replace(
            base,
            steps=args.steps or cfg.trainer.max_steps,
            warmup_steps=o.warmup_steps,
            min_lr=args.lr * TransferSpec.min_lr_ratio,
            weight_decay=o.weight_decay,
            grad_clip=o.grad_clip,
        )
    return [dataclasses.replace(base, optimizer=o) for o in optimizers]


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    print(f"{'':16}{'slope of log RMS vs log width, after the last step':>56}")
    print(f"{'':16}" + "".join(f"{layer:>18}" for layer in (*LAYERS, ATTENTION_LOGITS)))
    for setup in setups(args):
        for parametrization in ("sp", "mup"):
            start = time.time()
            result = coord_check(setup, parametrization)
            results.append(result)
            label = f"{NAMES[setup.optimizer]} {NAMES[parametrization]}"
            print(
                f"{label:<16}"
                + "".join(f"{s:>+18.2f}" for s in result.slopes().values())
                + f"   ({time.time() - start:.0f} s)",
                flush=True,
            )
    plot_coord_check(results, args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    run(main)
