"""Peak memory and time of CausalLMLoss's one-shot vs chunked cross-entropy at a real vocabulary, on CPU;
with --forms, the speed of the ways to write the one-shot loss as a compiled bf16 step runs it.

Usage: python scripts/bench_loss.py [--vocab 32768] [--batch 8] [--seq 512] [--hidden 256] [--layers 2] [--steps 3]
       python scripts/bench_loss.py --forms [--backend inductor] [same shape options]
       python scripts/bench_loss.py --forms --in-step ["OVERRIDE ..."] [--steps 30]
--forms times the LM head and the loss alone; with --in-step, train.py's whole step of the run the Hydra
overrides configure (the default run: "") once per form, interleaved.
Each variant runs in a fresh process (freed memory may stay resident, so one process cannot measure
two peaks); the peak is the process's max RSS during forward + backward, minus its RSS before,
and, beside it, the peak of live tensors in one more step counted by torch's MemTracker (what the
allocator is asked for: deterministic, unlike RSS, which depends on the heap's history).
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
import types

import torch
import torch.nn.functional as F

from cli import REPO
from cli.entry import description
from model import ModelConfig, Transformer
from training.compile import CompiledLoss, cache_for_this_cpu
from training.loss import CHUNK_ELEMENTS, IGNORE_INDEX, CausalLMLoss, cross_entropy
from training.runtime.memory import current_memory_bytes, peak_memory_bytes, reset_peak_memory

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
    p.add_argument("--forms", action="store_true",
                   help="time the loss's forms (FORMS) compiled under bf16 autocast, interleaved in one process")
    p.add_argument("--in-step", nargs="?", const="", default=None, metavar="OVERRIDES",
                   help="with --forms: each form inside train.py's step of the run these Hydra overrides configure "
                        "(none: the default run)")
    p.add_argument("--backend", default="inductor", help="torch.compile backend of --forms (tests: aot_eager)")
    p.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)  # the child process
    return p.parse_args(argv)


def measure(args) -> dict:
    """Runs in the child: one variant's peak RSS increase and median step time."""
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, n_layers=args.layers, n_heads=args.hidden // 64,
                      max_seq_len=args.seq)
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
    return {"peak": max(peaks), "live": live, "seconds": statistics.median(times), "loss": loss.item(),
            "chunk_tokens": loss_fn.chunk_tokens(y.numel(), cfg.padded_vocab_size)}


def plain_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CausalLMLoss's one-shot loss before the one-pass backward: the logits cast to fp32, then F.cross_entropy."""
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX)


def logsumexp_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The same mean, written as logsumexp − the target's logit: nothing but the (N,) row sums needs fp32 logits
    kept for backward, where log_softmax keeps all N × V of them (the lever issue 39 names)."""
    valid = targets != IGNORE_INDEX
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 at least, as the default casts
    target_logit = wide.gather(1, targets.masked_fill(~valid, 0)[:, None]).squeeze(1)
    return ((torch.logsumexp(wide, dim=-1) - target_logit) * valid).sum() / valid.sum()


FORMS = {"F.cross_entropy on fp32 logits (before)": plain_cross_entropy,
         "one-pass backward (training/loss.py, the default)": cross_entropy,
         "logsumexp − target logit": logsumexp_cross_entropy}


def compare_forms(args) -> None:
    """The LM head and the loss of one step (hidden → logits → loss, forward + backward) in each form, compiled
    under bf16 autocast as the default step computes them, timed interleaved: a round runs every form once."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cache_for_this_cpu()
    n = args.batch * args.seq
    hidden = torch.randn(n, args.hidden, requires_grad=True)
    head = (torch.randn(args.vocab, args.hidden) * args.hidden ** -0.5).requires_grad_()
    targets = torch.randint(0, args.vocab, (n,))
    targets[::97] = IGNORE_INDEX  # padding is never a target, in either form

    def step_of(form):
        def step():
            with torch.autocast("cpu", torch.bfloat16):
                logits = hidden @ head.T
            return form(logits, targets)
        return torch.compile(step, backend=args.backend)

    steps = {name: step_of(form) for name, form in FORMS.items()}
    times, results = {name: [] for name in FORMS}, {}
    for round_ in range(args.steps + 1):  # round 0 compiles and is not timed
        for name, step in steps.items():
            hidden.grad = head.grad = None
            t0 = time.perf_counter()
            loss = step()
            loss.backward()
            if round_:
                times[name].append(time.perf_counter() - t0)
            results[name] = (loss.item(), hidden.grad.clone(), head.grad.clone())
    first = results[next(iter(FORMS))]
    print(f"torch {torch.__version__}, {args.threads} threads, bf16 autocast, compiled ({args.backend}); {n:,} tokens × "
          f"hidden {args.hidden} → vocab {args.vocab}; median of {args.steps} interleaved rounds")
    print("| loss form | ms (median) | min–max ms | vs the first | loss | max |Δ grad| vs the first |")
    print("|---|---:|---:|---:|---:|---:|")
    base = statistics.median(times[next(iter(FORMS))])
    for name, (loss, g_hidden, g_head) in results.items():
        ms = statistics.median(times[name])
        delta = max((g_hidden - first[1]).abs().max().item(), (g_head - first[2]).abs().max().item())
        print(f"| {name} | {ms * 1e3:,.1f} | {min(times[name]) * 1e3:,.1f}–{max(times[name]) * 1e3:,.1f} | "
              f"{base / ms:.3f}× | {loss:.6f} | {delta:.1e} |")


def with_loss_form(loss_module: CausalLMLoss, form) -> CausalLMLoss:
    """The same module computing its one-shot loss with `form` (logits (N, V), targets (N,) → mean)."""
    def forward(self, input_ids, targets):
        hidden = self.model.lm_head_input(self.model.hidden_states(input_ids))
        return form(self.model.lm_head(hidden).flatten(0, 1), targets.flatten())
    loss_module.forward = types.MethodType(forward, loss_module)
    return loss_module


def compare_forms_in_step(args) -> None:
    """train.py's step (devtools/bench/roofline.py build_step) once per form, compiled with --backend, timed
    interleaved: what a form changes in the step users run, not only in the head and the loss."""
    from devtools.bench.roofline import build_step, time_interleaved
    torch.set_num_threads(args.threads)
    steps = {}
    for name, form in FORMS.items():
        cfg, parts, step = build_step(shlex.split(args.in_step))
        tokens = cfg.trainer.micro_batch_size * cfg.trainer.seq_len
        if parts.loss_module.chunk_tokens(tokens, cfg.model.padded_vocab_size) is not None:
            raise ValueError("--in-step: this run uses the chunked loss (trainer.chunked_loss); the forms are the "
                             "one-shot loss's")
        step.loss_module = CompiledLoss(with_loss_form(parts.loss_module, form), backend=args.backend)
        steps[name] = step
    times = time_interleaved(steps, args.steps, warmup=3)
    print(f"torch {torch.__version__}, {args.threads} threads, {parts.precision}, compiled ({args.backend}); train.py's "
          f"step, overrides: {args.in_step or '(the default run)'}; median of {args.steps} interleaved steps")
    print("| loss form | ms/step (median) | min–max ms | vs the first |\n|---|---:|---:|---:|")
    base = statistics.median(times[next(iter(FORMS))])
    for name, ts in times.items():
        ms = statistics.median(ts)
        print(f"| {name} | {ms * 1e3:,.1f} | {min(ts) * 1e3:,.1f}–{max(ts) * 1e3:,.1f} | {base / ms:.3f}× |")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.in_step is not None and not args.forms:
        raise ValueError("--in-step times the forms inside a step: add --forms")
    if args.forms:
        if args.backend not in torch._dynamo.list_backends(exclude_tags=()):
            raise SystemExit(f"error: --backend {args.backend}: not a torch.compile backend; use inductor (the "
                             "default) or aot_eager, or see torch._dynamo.list_backends()")
        compare_forms_in_step(args) if args.in_step is not None else compare_forms(args)
        return
    if args.variant:
        print(json.dumps(measure(args)))
        return
    if not reset_peak_memory(torch.device("cpu")):
        raise SystemExit("error: measuring a peak needs Linux's /proc/self/clear_refs")
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    results = {}
    for name in VARIANTS:
        out = subprocess.run([sys.executable, str(SCRIPT), *passed, "--variant", name], capture_output=True, text=True,
                             check=True)
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    n = args.batch * args.seq
    logits_mb = n * args.vocab * 4 / 2 ** 20
    print(f"torch {torch.__version__}, {args.threads} threads, fp32; model hidden {args.hidden}, {args.layers} layers, "
          f"vocab {args.vocab}; batch {args.batch} × {args.seq} = {n:,} tokens; one fp32 logits copy = "
          f"{logits_mb:,.0f} MiB; chunks of {CHUNK_ELEMENTS:,} logits")
    print("| cross-entropy | peak RSS increase, forward + backward | peak live tensors | ms (median) | loss |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        label = name if r["chunk_tokens"] is None else f"{name} ({r['chunk_tokens']} tokens per chunk)"
        print(f"| {label} | {r['peak'] / 2 ** 20:,.0f} MiB | {r['live'] / 2 ** 20:,.0f} MiB live | "
              f"{r['seconds'] * 1e3:,.0f} | {r['loss']:.6f} |")
    one, chunked = results["one-shot"]["live"], results["chunked"]["live"]
    print(f"chunked saves {(one - chunked) / 2 ** 20:,.0f} MiB ({(one - chunked) / logits_mb / 2 ** 20:.1f} fp32 "
          f"logits copies) of live tensors, {100 * (1 - chunked / one):.0f} % of the step's peak")
