"""Each attention kernel (model.attention_kernel) alone at a run's shape, compiled: forward, and forward + backward.

Usage: python scripts/bench_attention.py [OVERRIDE ...] [--rounds 7] [--iters 10] [--precision bf16] [--threads 2]
The queries, keys and values have the run's shape (micro_batch_size × n_heads × seq_len × head_dim, its kv heads);
each kernel is compiled as the model compiles it and timed interleaved with the others, round by round (medians).
Beside the times: each kernel's relative error (‖x − exact‖ / ‖exact‖, the worst of the output and the q, k, v
gradients) against SDPA in float64 on the same rounded inputs, and whether they are finite. The step-level effect
is scripts/bench_roofline.py's --variant "model.attention_kernel=…".
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

from cli.config import compose_train_config
from cli.entry import description
from devtools.bench import timed
from model.attention import matmul_attention
from model.hybrid_attention import hybrid_attention
from training.compile import cache_for_this_cpu
from training.runtime.cpu import cpu_class, cpu_model

KERNELS = {  # name → (q, k, v, scale) → out, each as model/attention.py calls it in training (causal, no cache)
    "sdpa": lambda q, k, v, scale: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                                  enable_gqa=k.shape[1] != q.shape[1]),
    "matmul": matmul_attention,
    "hybrid": hybrid_attention,
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the run (default: the default run)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians)")
    p.add_argument("--iters", type=int, default=10, help="calls per kernel per round")
    p.add_argument("--precision", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (tests: aot_eager)")
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def inputs(overrides: list, dtype: torch.dtype) -> tuple:
    """(q, k, v, upstream gradient, scale) of the run's shape, Gaussian, requiring gradients."""
    cfg, _ = compose_train_config([*overrides, "logger=none"])
    m, gen = cfg.model, torch.Generator().manual_seed(0)
    B, T = cfg.trainer.micro_batch_size, cfg.trainer.seq_len
    q = torch.randn(B, m.n_heads, T, m.head_dim, generator=gen).to(dtype).requires_grad_()
    k, v = (torch.randn(B, m.resolved_n_kv_heads, T, m.head_dim, generator=gen).to(dtype).requires_grad_()
            for _ in range(2))
    return q, k, v, torch.randn(q.shape, generator=gen).to(dtype), None


def measure(args) -> dict:
    """kernel → {forward ms, forward + backward ms, relative error vs float64 SDPA (worst of out and gradients),
    finite}."""
    q, k, v, grad_out, scale = inputs(args.overrides, DTYPES[args.precision])
    cache_for_this_cpu()
    compiled = {name: torch.compile(fn, backend=args.backend) for name, fn in KERNELS.items()}
    results = {}

    def forward(fn):
        with torch.no_grad():
            fn(q, k, v, scale)

    def both(fn):
        out = fn(q, k, v, scale)
        return out, torch.autograd.grad(out, (q, k, v), grad_out)

    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]  # the same rounded inputs, in float64
    out = KERNELS["sdpa"](*exact, scale)
    truth = [out.detach(), *torch.autograd.grad(out, exact, grad_out.double())]
    for name, fn in compiled.items():  # compile (forward alone and with backward), and the numbers
        forward(fn)
        out, grads = both(fn)
        got = [out.detach().double(), *(g.double() for g in grads)]
        results[name] = {"error": max(float((a - b).norm() / b.norm()) for a, b in zip(got, truth)),
                         "finite": all(bool(torch.isfinite(t).all()) for t in got), "fwd": [], "fwd_bwd": []}
    for _ in range(args.rounds):
        for name, fn in compiled.items():
            results[name]["fwd"].append(timed(lambda: [forward(fn) for _ in range(args.iters)]) / args.iters)
            results[name]["fwd_bwd"].append(timed(lambda: [both(fn) for _ in range(args.iters)]) / args.iters)
    return {name: {**r, "fwd": 1e3 * statistics.median(r["fwd"]), "fwd_bwd": 1e3 * statistics.median(r["fwd_bwd"])}
            for name, r in results.items()}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.backend not in torch._dynamo.list_backends(exclude_tags=()):
        raise SystemExit(f"error: --backend {args.backend}: not a torch.compile backend; use inductor (the default) "
                         "or aot_eager, or see torch._dynamo.list_backends()")
    torch.set_num_threads(args.threads)
    q = inputs(args.overrides, torch.float32)[0]
    print(f"{cpu_model()}, CPU class {cpu_class().name}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{args.precision}, compiled ({args.backend}); q {tuple(q.shape)}; overrides: "
          f"{' '.join(args.overrides) or '(the default run)'}\n")
    results = measure(args)
    base = results["sdpa"]["fwd_bwd"]
    print(f"| kernel | forward ms (median of {args.rounds}) | forward + backward ms | backward ms | vs sdpa "
          "(forward + backward) | error vs float64 (worst of out, dq, dk, dv) | finite |\n|---|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        print(f"| {name} | {r['fwd']:.2f} | {r['fwd_bwd']:.2f} | {r['fwd_bwd'] - r['fwd']:.2f} | {base / r['fwd_bwd']:.3f}× "
              f"| {r['error']:.4f} | {'yes' if r['finite'] else 'NO'} |")
