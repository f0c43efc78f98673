"""μP's coordinate check (Tensor Programs V, §5): activation RMS against width after each of a few training steps, SP
and μP side by side, for AdamW and Muon; prints the fitted slopes (0 = flat in width) and writes the figure.

Usage: python -m lab.coord_check [--widths 64,128,256,512,1024] [--steps 10] [--out coord_check.png]
       python -m lab.coord_check --as-trained   # the transfer runs' warmup, cosine, clipping, weight decay, 150 steps
Width 1024 with Muon takes about a minute on one core (Newton–Schulz at that size).
"""

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

import matplotlib
import numpy as np
import torch

from analysis.plots import figure, save
from data import DataConfig
from lab import SEARCH_PATH
from lab.mup_transfer import NAMES, TransferSpec
from model import ModelConfig, Transformer
from model.attention import hook_attention_logits
from training.config import LoggerConfig, OptimConfig, TrainConfig, TrainerConfig
from training.distributed import DistInfo
from training.loop import TrainStep, build
from training.optim import apply_schedule
from training.program import compose_train_config, description, run

LAYERS = ("embedding", "attention", "mlp", "logits")  # what each block part hands on, averaged over blocks
ATTENTION_LOGITS = "attention logits"  # q·k × scale before the softmax, every block: recorded beside LAYERS


@dataclass(frozen=True)
class CoordSetup:
    """One coordinate check: the width ladder and what every width trains with (the same batches)."""

    widths: tuple = (64, 128, 256, 512, 1024)
    base_width: int = 64  # mup_base_width: μP equals SP here
    optimizer: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for the rest)
    lr: float = 1e-2  # the peak; constant unless warmup_steps or min_lr say otherwise
    steps: int = 5
    warmup_steps: int = 0  # these four at their defaults: the raw update rule; else the run's schedule and
    min_lr: float = None  # regularisation (cosine from lr to min_lr over `steps`; None: min_lr = lr)
    weight_decay: float = 0.0
    grad_clip: float = 0.0
    n_layers: int = 2
    n_heads: int = 4  # fixed: head_dim grows with width (model/parametrization.py assumes so)
    vocab_size: int = 256
    seq_len: int = 32
    batch_size: int = 8
    seed: int = 0


@dataclass
class CoordResult:
    """rms[layer] and moved[layer]: arrays (steps + 1, len(widths)); row t is after t updates. The layers are
    LAYERS and ATTENTION_LOGITS."""

    setup: CoordSetup
    parametrization: str
    rms: Dict[str, np.ndarray]
    moved: Dict[str, np.ndarray]  # RMS of (activation now − activation at init), same probe batch

    def slopes(self, step: int = -1, moved: bool = False) -> Dict[str, float]:
        """{layer: slope of log RMS against log width} at `step` (default the last): 0 = flat in width."""
        table = self.moved if moved else self.rms
        return {layer: fitted_slope(self.setup.widths, values[step]) for layer, values in table.items()}


def fitted_slope(widths: Sequence[int], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) on log(width): RMS ∝ width^slope."""
    return float(np.polyfit(np.log(widths), np.log(np.asarray(values, dtype=float)), 1)[0])


def bigram_tokens(setup: CoordSetup, n_batches: int) -> List[torch.Tensor]:
    """Batches (batch_size, seq_len + 1) from a fixed random bigram chain (each token has 4 likely
    successors): something learnable, the same at every width, no data files needed."""
    g = torch.Generator().manual_seed(setup.seed)
    successors = torch.randint(0, setup.vocab_size, (setup.vocab_size, 4), generator=g)
    batches = []
    for _ in range(n_batches):
        tokens = torch.empty(setup.batch_size, setup.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, setup.vocab_size, (setup.batch_size,), generator=g)
        for t in range(setup.seq_len):
            choice = torch.randint(0, 4, (setup.batch_size,), generator=g)
            tokens[:, t + 1] = successors[tokens[:, t], choice]
        batches.append(tokens)
    return batches


def coord_check(setup: CoordSetup, parametrization: str) -> CoordResult:
    """Every width of the ladder from the same seed, batches and probe; nothing is written anywhere."""
    batches = bigram_tokens(setup, setup.steps + 1)  # the last one is the probe, never trained on
    per_width = [_train_width(setup, width, parametrization, batches[:-1], batches[-1]) for width in setup.widths]

    def table(kind: int) -> Dict[str, np.ndarray]:  # (steps + 1, widths) per layer
        return {
            layer: np.array([[w[kind][t][layer] for w in per_width] for t in range(setup.steps + 1)])
            for layer in (*LAYERS, ATTENTION_LOGITS)
        }

    return CoordResult(setup, parametrization, table(0), table(1))


class _Batches:
    """TrainStep's batches (training/loop.py): step n's batch, whole (one micro-batch)."""

    def __init__(self, batches):
        self.batches = batches

    def get(self, step: int, micro: int) -> tuple:
        return self.batches[step][:, :-1], self.batches[step][:, 1:]


def run_config(setup: CoordSetup, width: int, parametrization: str) -> TrainConfig:
    """The width as a training run: fp32, eager, one process, the setup's schedule, clipping and weight decay."""
    optim = OptimConfig(
        name=setup.optimizer,
        lr=setup.lr,
        min_lr=setup.lr if setup.min_lr is None else setup.min_lr,
        warmup_steps=setup.warmup_steps,
        weight_decay=setup.weight_decay,
        grad_clip=setup.grad_clip,
    )
    trainer = TrainerConfig(
        device="cpu",
        precision="fp32",
        compile="false",
        parallel="none",
        time_budget=None,
        max_steps=setup.steps,
        micro_batch_size=setup.batch_size,
        seq_len=setup.seq_len,
    )
    return TrainConfig(
        model=ModelConfig(
            vocab_size=setup.vocab_size,
            hidden_size=width,
            n_layers=setup.n_layers,
            n_heads=setup.n_heads,
            max_seq_len=setup.seq_len,
            parametrization=parametrization,
            mup_base_width=setup.base_width,
        ),
        data=DataConfig(),
        optim=optim,
        trainer=trainer,
        logger=LoggerConfig(wandb="disabled"),
        seed=setup.seed,
    )


def _train_width(setup: CoordSetup, width: int, parametrization: str, batches, probe) -> tuple:
    """([{layer: RMS}], [{layer: RMS moved}]) after 0..steps updates of one width: built by training/loop.py and
    stepped by TrainStep, as train.py's runs are."""
    cfg = run_config(setup, width, parametrization)
    info = DistInfo()
    parts = build(cfg, info, say=lambda *a: None)
    model = parts.raw_model
    step = TrainStep(
        parts.compute_loss, _Batches(batches), parts.optimizers, parts.autocast, 1, cfg.optim.grad_clip, info.device
    )
    init = _activations(model, probe[:, :-1])
    rms, moved = [], []
    for t in range(setup.steps + 1):
        acts = init if t == 0 else _activations(model, probe[:, :-1])
        rms.append({layer: _rms(a) for layer, a in acts.items()})
        moved.append({layer: _rms(a - init[layer]) for layer, a in acts.items()})
        if t == setup.steps:
            break
        apply_schedule(parts.optimizers, t, cfg.optim, setup.steps)  # the lr_scale of every group, as in training
        step(t)
    return rms, moved


@torch.no_grad()
def _activations(model: Transformer, ids: torch.Tensor) -> Dict[str, torch.Tensor]:
    """What each layer kind outputs on `ids`: block outputs stacked over blocks; and the attention logits."""
    found = {"attention": [], "mlp": [], ATTENTION_LOGITS: []}
    hooks = [
        block.attn.register_forward_hook(lambda m, a, out: found["attention"].append(out)) for block in model.layers
    ]
    for block in model.layers:  # q and k after their norms, the logits once RoPE's tables are known
        hooks += hook_attention_logits(block.attn, found[ATTENTION_LOGITS].append)
    hooks += [block.mlp.register_forward_hook(lambda m, a, out: found["mlp"].append(out)) for block in model.layers]
    hooks.append(model.embed_tokens.register_forward_hook(lambda m, a, out: found.__setitem__("embedding", out)))
    try:
        logits = model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return {
        "embedding": found["embedding"],
        "attention": torch.stack(found["attention"]),
        "mlp": torch.stack(found["mlp"]),
        "logits": logits,
        ATTENTION_LOGITS: torch.cat(found[ATTENTION_LOGITS]),
    }


def _rms(t: torch.Tensor) -> float:
    return math.sqrt(t.double().pow(2).mean().item())


def plot_coord_check(results: Sequence[CoordResult], path: Path) -> None:
    """One column per (optimizer, parametrization), one row per layer kind; x width, y RMS (both log), one line per
    step from init (light) to the last (dark). Rows share their y-axis: SP's growth and μP's flat lines on one scale."""
    rows = (*LAYERS, ATTENTION_LOGITS)
    size = (3.6 * len(results), 2.8 * len(rows))
    fig, axes = figure(len(rows), len(results), figsize=size, squeeze=False, sharey="row")
    for col, result in enumerate(results):
        steps, slopes = result.setup.steps, result.slopes()
        name = f"{NAMES[result.setup.optimizer]} · {NAMES[result.parametrization]}"
        for row, layer in enumerate(rows):
            ax = axes[row][col]
            for t, values in enumerate(result.rms[layer]):
                colour, label = (
                    matplotlib.colormaps["viridis"](t / max(steps, 1)),
                    f"t={t}" if t in (0, steps) else None,
                )
                ax.plot(result.setup.widths, values, marker="o", ms=3, color=colour, label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{name}: {layer} (slope {slopes[layer]:+.2f})", fontsize=9)
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("width (hidden_size)")
    for ax in axes[:, 0]:
        ax.set_ylabel("activation RMS")
    axes[0][0].legend(fontsize=7)
    save(fig, path)


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
            slopes = "".join(f"{v:>+18.2f}" for v in result.slopes().values())
            label = f"{NAMES[setup.optimizer]} {NAMES[parametrization]}"
            print(f"{label:<16}{slopes}   ({time.time() - start:.0f} s)", flush=True)
    plot_coord_check(results, args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    run(main)
