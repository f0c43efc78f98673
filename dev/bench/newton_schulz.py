"""Muon's Newton–Schulz in bf16 against fp32 at a run's matrix shapes: time, and what bf16 changes in the result.

The matrices are the run's Muon matrices (the default run's, or the overrides'), filled with Gaussian gradients; each
shape is orthogonalised with optim.muon_ns_steps steps in fp32 and in bf16 (best of 7, every matrix of the run once per
repeat), and bf16's result is compared with fp32's: the relative Frobenius difference and both results' singular
values. The quintic iteration lands them in a band around 1 (about 0.7–1.2): does bf16 keep fp32's band?
"""

import argparse

import torch

from dev.bench import machine, timed
from model import Transformer
from training.optim import build_optimizers, newton_schulz
from training.program import compose_train_config, description

REPEATS = 7


def muon_shapes(overrides: list) -> tuple:
    """([shape of each Muon matrix], Newton–Schulz steps, coefficients) of the run these overrides configure."""
    cfg, _ = compose_train_config([*overrides, "logger=none", "optim=muon"])
    muon = build_optimizers(Transformer(cfg.model), cfg.optim, "cpu")[0]
    group = muon.param_groups[0]
    return [tuple(p.shape) for p in group["params"]], group["ns_steps"], group["ns_coefficients"]


def compare(shape: tuple, count: int, steps: int, coefficients: tuple, gen: torch.Generator) -> dict:
    """Time of `count` orthogonalisations of `shape` per dtype (best of REPEATS), and bf16's difference from fp32."""
    grads = [torch.randn(shape, generator=gen) for _ in range(count)]
    out, best = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        run = lambda: [newton_schulz(g, coefficients, steps, 1e-7, dtype) for g in grads]  # noqa: E731
        out[dtype] = run()
        best[dtype] = min(timed(run) for _ in range(REPEATS))
    diff = max(float((b.float() - f).norm() / f.norm()) for f, b in zip(out[torch.float32], out[torch.bfloat16]))
    sv = {dtype: torch.cat([torch.linalg.svdvals(x.float()) for x in xs]) for dtype, xs in out.items()}
    return {
        "fp32_ms": 1e3 * best[torch.float32],
        "bf16_ms": 1e3 * best[torch.bfloat16],
        "diff": diff,
        "fp32_sv": (float(sv[torch.float32].min()), float(sv[torch.float32].max())),
        "bf16_sv": (float(sv[torch.bfloat16].min()), float(sv[torch.bfloat16].max())),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the run (default: the default run)")
    args = p.parse_args(argv)
    shapes, steps, coefficients = muon_shapes(args.overrides)
    print(
        f"{machine()}; {len(shapes)} Muon matrices, {steps} Newton–Schulz steps; overrides: {' '.join(args.overrides) or '(none)'}\n"
    )
    print(
        "| shape | matrices | fp32 ms | bf16 ms | fp32 / bf16 | bf16 vs fp32 (rel. Frobenius) "
        "| singular values fp32 | bf16 |\n|---|---:|---:|---:|---:|---:|---|---|"
    )
    gen, total = torch.Generator().manual_seed(0), {"fp32_ms": 0.0, "bf16_ms": 0.0}
    for shape in dict.fromkeys(shapes):
        r = compare(shape, shapes.count(shape), steps, coefficients, gen)
        total = {k: total[k] + r[k] for k in total}
        print(
            f"| {shape[0]} × {shape[1]} | {shapes.count(shape)} | {r['fp32_ms']:.1f} | {r['bf16_ms']:.1f} "
            f"| {r['fp32_ms'] / r['bf16_ms']:.2f}× | {r['diff']:.4f} | {r['fp32_sv'][0]:.3f}–{r['fp32_sv'][1]:.3f} "
            f"| {r['bf16_sv'][0]:.3f}–{r['bf16_sv'][1]:.3f} |"
        )
    print(
        f"| **all** | {len(shapes)} | **{total['fp32_ms']:.1f}** | **{total['bf16_ms']:.1f}** "
        f"| **{total['fp32_ms'] / total['bf16_ms']:.2f}×** | | | |"
    )
