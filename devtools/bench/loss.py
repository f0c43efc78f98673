"""Peak memory and time of CausalLMLoss's one-shot vs chunked cross-entropy at a real vocabulary, on CPU.

Usage: python scripts/bench_loss.py [--vocab 32768] [--batch 8] [--seq 512] [--hidden 256] [--layers 2] [--steps 3]
Each variant runs in a fresh process (freed memory may stay resident, so one process cannot measure
two peaks); the peak is the process's max RSS during forward + backward, minus its RSS before,
and, beside it, the peak of live tensors in one more step counted by torch's MemTracker (what the
allocator is asked for: deterministic, unlike RSS, which depends on the heap's history).
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from cli import REPO, description
from cli.estimate import current_memory_bytes, reset_peak_memory
from model import ModelConfig, Transformer
from training.log import peak_memory_bytes
from training.loop import CHUNK_ELEMENTS, CausalLMLoss

VARIANTS = {"one-shot": None, "chunked": 0}  # CausalLMLoss(chunk_above=...)
SCRIPT = REPO / "scripts" / "bench_loss.py"  # each variant: this program again, in a fresh process


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="timed forward + backward passes (median)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)  # the child process
    return p.parse_args(argv)


def measure(args) -> dict:
    """Runs in the child: one variant's peak RSS increase and median step time."""
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        n_layers=args.layers,
        n_heads=args.hidden // 64,
        max_seq_len=args.seq,
    )
    loss_fn = CausalLMLoss(Transformer(cfg), chunk_above=VARIANTS[args.variant])
    x, y = (torch.randint(0, args.vocab, (args.batch, args.seq)) for _ in range(2))
    loss_fn(x, y).backward()  # warm-up: gradients and the allocator's first pages
    times, peaks = [], []
    for _ in range(args.steps):
        loss_fn.zero_grad(set_to_none=True)
        base = current_memory_bytes(cpu)
        reset_peak_memory(cpu)
        t0 = time.perf_counter()
        loss = loss_fn(x, y)
        loss.backward()
        times.append(time.perf_counter() - t0)
        peaks.append(peak_memory_bytes(cpu) - base)
    from torch.distributed._tools.mem_tracker import MemTracker

    loss_fn.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(loss_fn)
    with tracker:
        loss_fn(x, y).backward()
    tracked = tracker.get_tracker_snapshot("peak")[cpu]
    live = tracked["Total"] - sum(v for k, v in tracked.items() if getattr(k, "value", None) in ("Parameter", "Buffer"))
    return {
        "peak": max(peaks),
        "live": live,
        "seconds": statistics.median(times),
        "loss": loss.item(),
        "chunk_tokens": loss_fn.chunk_tokens(y.numel(), cfg.padded_vocab_size),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.variant:
        print(json.dumps(measure(args)))
        return
    if not reset_peak_memory(torch.device("cpu")):
        raise SystemExit("error: measuring a peak needs Linux's /proc/self/clear_refs")
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    results = {}
    for name in VARIANTS:
        out = subprocess.run(
            [sys.executable, str(SCRIPT), *passed, "--variant", name], capture_output=True, text=True, check=True
        )
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    n = args.batch * args.seq
    logits_mb = n * args.vocab * 4 / 2**20
    print(
        f"torch {torch.__version__}, {args.threads} threads, fp32; model hidden {args.hidden}, {args.layers} layers, "
        f"vocab {args.vocab}; batch {args.batch} × {args.seq} = {n:,} tokens; one fp32 logits copy = "
        f"{logits_mb:,.0f} MiB; chunks of {CHUNK_ELEMENTS:,} logits"
    )
    print("| cross-entropy | peak RSS increase, forward + backward | peak live tensors | ms (median) | loss |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        label = name if r["chunk_tokens"] is None else f"{name} ({r['chunk_tokens']} tokens per chunk)"
        print(
            f"| {label} | {r['peak'] / 2**20:,.0f} MiB | {r['live'] / 2**20:,.0f} MiB live | "
            f"{r['seconds'] * 1e3:,.0f} | {r['loss']:.6f} |"
        )
    one, chunked = results["one-shot"]["live"], results["chunked"]["live"]
    print(
        f"chunked saves {(one - chunked) / 2**20:,.0f} MiB ({(one - chunked) / logits_mb / 2**20:.1f} fp32 "
        f"logits copies) of live tensors, {100 * (1 - chunked / one):.0f} % of the step's peak"
    )
