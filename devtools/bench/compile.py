"""Where torch.compile's speed-up comes from: what is inside the compiled region, side by side in one process.

Usage: python scripts/bench_compile.py [--steps 8] [--warmup 2] [--precision auto|bf16|fp32] [--threads 2]
Variants on the default `cpu` model (batch 16 × 256), each with its own copy of the same weights:
  eager               CausalLMLoss, no compile
  model only          torch.compile(model); the fp32 cross-entropy runs eagerly outside (train.py before issue 11)
  model + loss        torch.compile(CausalLMLoss): the loss fuses with the head
  autocast inside     model + loss with the bf16 autocast opened inside the compiled region (bf16 only)
"""

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

from cli import description
from model import ModelConfig, Transformer
from training.config import OptimConfig
from training.loop import CausalLMLoss, autocast_context, cache_for_this_cpu, resolve_precision
from training.optim import build_optimizer


class AutocastInside(torch.nn.Module):
    """The loss module with autocast entered inside forward, so dynamo traces it into the graph."""

    def __init__(self, loss_module: torch.nn.Module, autocast):
        super().__init__()
        self.loss_module, self.autocast = loss_module, autocast

    def forward(self, inputs, targets):
        with self.autocast():
            return self.loss_module(inputs, targets)


def variants(cfg: ModelConfig, precision: str, autocast) -> dict:
    """name → (module that owns the parameters, loss function, autocast to open around the call)."""
    torch.manual_seed(0)
    cache_for_this_cpu()
    base = CausalLMLoss(Transformer(cfg))
    fresh = lambda: copy.deepcopy(base)  # noqa: E731  same weights for every variant
    out = {"eager": (base, base, autocast)}
    model_only = fresh()
    compiled_model = torch.compile(model_only.model)
    out["model only"] = (
        model_only,
        lambda x, y: F.cross_entropy(compiled_model(x).float().flatten(0, 1), y.flatten()),
        autocast,
    )
    together = fresh()
    out["model + loss"] = (together, torch.compile(together), autocast)
    if precision == "bf16":
        inside = AutocastInside(fresh(), autocast)
        out["autocast inside"] = (inside, torch.compile(inside), lambda: torch.autocast("cpu", enabled=False))
    return out


def make_step(owner, loss_fn, autocast):
    optimizer = build_optimizer(owner, OptimConfig(lr=1e-4, min_lr=1e-5), "cpu")

    def step(x, y):
        with autocast():
            loss = loss_fn(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    precision, why = resolve_precision(args.precision, cpu)
    cfg = ModelConfig(vocab_size=4096, hidden_size=256, n_layers=6, n_heads=4, multiple_of=32, max_seq_len=256)
    steps = {name: make_step(*v) for name, v in variants(cfg, precision, autocast_context(precision, cpu)).items()}
    data = torch.randint(0, cfg.vocab_size, (16, 257), generator=torch.Generator().manual_seed(0))
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {precision} ({why}), default cpu model, "
        f"batch 16 × 256"
    )
    first = {}
    for name, step in steps.items():
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            step(x, y)
        first[name] = time.perf_counter() - t0
    times = {name: [] for name in steps}
    names = list(steps)
    for i in range(args.steps):
        for name in names[i % len(names) :] + names[: i % len(names)]:  # interleaved, rotating the order
            t0 = time.perf_counter()
            steps[name](x, y)
            times[name].append(time.perf_counter() - t0)
    eager = 16 * 256 / statistics.median(times["eager"])
    print(f"| variant | tokens/s (median of {args.steps}) | vs eager | warm-up incl. compile, s |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        tps = 16 * 256 / statistics.median(ts)
        print(f"| {name} | {tps:,.0f} | {tps / eager:.2f}× | {first[name]:.0f} |")
    if precision != "bf16":
        print(
            "(autocast inside vs outside the compiled region only differs under bf16 autocast: "
            "run with --precision bf16 on a CPU with AMX/AVX512-BF16 or a GPU)"
        )
