"""Where train.py's step goes, by op group, against the machine's roofs; and levers timed side by side.

Usage: python scripts/bench_roofline.py [OVERRIDE ...] [--variant "OVERRIDE ..."]...
       [--inductor-variant "NAME=VALUE ..."]... [--steps 20] [--profile-steps 5]
The step is train.py's own: the config composed from configs/ (the default run, plus any Hydra overrides),
built by training/loop.py and stepped by TrainStep, on synthetic token windows of the run's shape. Each
--variant adds overrides to a second (third, …) build of the same run (--inductor-variant: compiled with these
torch._inductor.config options); all are
timed interleaved in this one process (medians): a lever against the step it changes, on one machine at one time.

The roofline is the first variant's, from torch.profiler's self CPU time of each op, grouped by what it
computes (GROUPS); the ops inside the optimizer's step are its own group whatever they are. Each group's
work is counted from the run's shapes: FLOPs for the matmul groups (the step's weight matmuls, the LM head,
causal attention, Muon's Newton–Schulz) against the measured square-matmul peak of the run's precision,
and, for elementwise groups, a lower bound of the bytes they must move (every tensor read or written once,
forward and backward, at the dtype it has) against the measured copy bandwidth. A group far below its roof
is where the step's time can still come from.
"""

import argparse
import ast
import os
import shlex
import statistics
import time
from typing import Optional

import torch
import torch._inductor.config as inductor_config

from cli import description
from cli.config import compose_train_config
from devtools.bench import cpu_model, measure_matmul_flops, timed
from model import Transformer
from training.distributed import DistInfo, cpu_bf16
from training.loop import CompiledLoss, TrainStep, build

NEWTON_SCHULZ = "optimizer: Newton–Schulz matmuls"

# (group, test on the kernel's name), first match wins; a compiled graph's kernels are named after the ops
# inductor fused into them (cpp_fused_<ops>_<n>, recorded with inductor's kernel profiling on), aten ops after
# themselves. Matmuls are told apart by their operands in group_of.
GROUPS = (
    ("loss (log-softmax, NLL)", lambda n: "log_softmax" in n or "nll_loss" in n),
    ("attention", lambda n: "scaled_dot_product" in n),
    ("softmax, mask", lambda n: "softmax" in n or "masked_fill" in n or "tril" in n),
    ("norms", lambda n: "rsqrt" in n or ("pow" in n and "sum" in n) or "layer_norm" in n),
    (
        "gradient norm, clip",
        lambda n: "vector_norm" in n or "foreach_norm" in n or "foreach_mul" in n or "isfinite" in n,
    ),
    ("MLP activation", lambda n: "silu" in n or "gelu" in n or "relu" in n),
    ("RoPE", lambda n: "cat" in n and "neg" in n),
    ("embedding", lambda n: "embedding" in n),
    ("casts, copies", lambda n: "to_copy" in n or n in ("aten::copy_", "aten::clone", "aten::_to_copy")),
)
FRAMEWORK = "framework (Python, dispatch, autograd)"
KERNEL_PREFIXES = ("aten::", "graph_", "cpp_fused")  # what does work; the rest is bookkeeping around it
# aten ops that move no data (views, allocation, dispatch to another op): bookkeeping, not elementwise work
BOOKKEEPING = {
    f"aten::{op}"
    for op in (
        "empty",
        "empty_strided",
        "empty_like",
        "as_strided",
        "view",
        "_unsafe_view",
        "reshape",
        "permute",
        "transpose",
        "t",
        "numpy_T",
        "expand",
        "unsqueeze",
        "squeeze",
        "slice",
        "select",
        "detach",
        "alias",
        "resolve_conj",
        "resolve_neg",
        "to",
        "matmul",
        "linear",
        "contiguous",
        "result_type",
        "lift_fresh",
        "split",
        "chunk",
        "unbind",
    )
}


def is_matmul(name: str) -> bool:
    return name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_int_mm")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the run (default: the default run)")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help='more overrides for a variant timed side by side, e.g. --variant "optim.muon_ns_dtype=bf16"',
    )
    p.add_argument(
        "--inductor-variant",
        action="append",
        default=[],
        help='the configured run compiled with these inductor options, e.g. "max_autotune=True"',
    )
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant, interleaved (medians)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first (compilation)")
    p.add_argument("--profile-steps", type=int, default=5, help="profiled steps of the first variant (0: none)")
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


class SyntheticBatches:
    """TrainStep's batches: fixed random windows of the run's shape, cycled (their values do not change the step)."""

    def __init__(self, cfg, n: int = 8):
        gen = torch.Generator().manual_seed(0)
        t = cfg.trainer
        self.windows = torch.randint(0, cfg.model.vocab_size, (n, t.micro_batch_size, t.seq_len + 1), generator=gen)

    def get(self, step: int, micro: int) -> tuple:
        w = self.windows[(step + micro) % len(self.windows)]
        return w[:, :-1], w[:, 1:]


def inductor_options(text: str) -> dict:
    """ "max_autotune=True cpp.threads=2" → {"max_autotune": True, "cpp.threads": 2}; names inductor does not have
    are refused (torch.compile would only warn and run eager)."""
    known, options = inductor_config.get_config_copy(), {}
    for item in shlex.split(text):
        name, sep, value = item.partition("=")
        if not sep or name not in known:
            raise ValueError(
                f"--inductor-variant {item!r}: expected NAME=VALUE with NAME one of "
                "torch._inductor.config's options, e.g. max_autotune=True"
            )
        try:
            options[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[name] = value  # a bare string, e.g. a backend's name
    return options


def build_step(overrides: list, inductor: Optional[dict] = None):
    """(TrainConfig, Parts, TrainStep) of the run these overrides configure, on one process; with `inductor`, its
    model + loss compiled with those inductor options."""
    cfg, _ = compose_train_config([*overrides, "logger=none"])
    parts = build(cfg, info := DistInfo(), say=lambda *a: None)
    compute_loss = parts.compute_loss
    if inductor is not None:
        if compute_loss is parts.loss_module:
            raise ValueError(f"--inductor-variant needs a compiled run; this one is not ({parts.notes[1]})")
        compute_loss = CompiledLoss(parts.loss_module, warn=_refuse_eager, options=inductor)
    step = TrainStep(
        compute_loss,
        SyntheticBatches(cfg),
        parts.optimizers,
        parts.autocast,
        cfg.trainer.grad_accum_steps,
        cfg.optim.grad_clip,
        info.device,
    )
    return cfg, parts, step


def _refuse_eager(message: str) -> None:
    """An inductor variant that fell back to eager would be timed as if compiled: stop instead."""
    raise ValueError(f"--inductor-variant: {message.removeprefix('warning: ')}")


def time_interleaved(steps: dict, n: int, warmup: int) -> dict:
    """name → [seconds per step]: each variant's warm-up first, then one step of each in turn, n times."""
    for step in steps.values():
        for i in range(warmup):
            step(i)
    times = {name: [] for name in steps}
    for i in range(n):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step(i)
            times[name].append(time.perf_counter() - t0)
    return times


def group_of(name: str, shapes: list, in_optimizer: bool, head_dims: tuple) -> str:
    """The op group of one profiled op: its name, its operands' shapes, whether the optimizer ran it."""
    if in_optimizer:
        return NEWTON_SCHULZ if is_matmul(name) else "optimizer: elementwise"
    if is_matmul(name):
        if name in ("aten::bmm", "aten::baddbmm"):  # batched over (batch × heads): attention's scores and output
            return "attention"
        a, b = (
            shapes[1:3] if name == "aten::addmm" else shapes[:2]
        )  # (m, k) @ (k, n): addmm(bias, a, b), mm(a, b[, out])
        # The head's three matmuls (forward, input and weight gradients) multiply tokens, hidden and vocab
        return "LM head matmuls" if sorted((a[0], a[1], b[1])) == sorted(head_dims) else "matmuls"
    return next((group for group, test in GROUPS if test(name)), "other elementwise")


def profile_groups(step, n: int, head_dims: tuple) -> tuple:
    """({group: seconds per step}, profiled seconds per step): each op's self CPU time under its group, and what
    no op accounts for (Python, dispatch, the autograd engine) as framework. Needs compiled graphs built with
    inductor's kernel profiling (main turns it on), or their kernels' time counts as framework."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for i in range(n):
            step(i)
        wall = (time.perf_counter() - t0) / n
    seconds = {}
    for event in prof.events():
        node, in_optimizer = event, False
        while node is not None:
            in_optimizer = in_optimizer or node.name.startswith("Optimizer.")
            node = node.cpu_parent
        if in_optimizer and not is_matmul(event.name) and not event.name.startswith(KERNEL_PREFIXES):
            group = "optimizer: elementwise"  # its Python loop over the parameters included
        elif event.name in BOOKKEEPING or not event.name.startswith(KERNEL_PREFIXES):
            group = FRAMEWORK
        else:
            group = group_of(event.name, event.input_shapes, in_optimizer, head_dims)
        seconds[group] = seconds.get(group, 0.0) + event.self_cpu_time_total / 1e6 / n
    seconds[FRAMEWORK] = seconds.get(FRAMEWORK, 0.0) + max(0.0, wall - sum(seconds.values()))
    return seconds, wall


def step_work(cfg, parts) -> dict:
    """group → (amount, "FLOP" | "B") of one optimizer step of this run: FLOPs of the matmul groups; for the
    elementwise ones the bytes they cannot avoid moving (each tensor once, forward and backward)."""
    m, t = cfg.model, cfg.trainer
    n = t.micro_batch_size * t.seq_len * t.grad_accum_steps  # tokens
    with torch.device("meta"):
        model = Transformer(m)
    head = model.lm_head.weight.numel()
    matrices = sum(p.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear) for p in mod.parameters())
    act = 2 if parts.precision == "bf16" else 4  # what matmuls output; the residual stream stays fp32
    d, f, heads = m.hidden_size, m.resolved_intermediate_size, m.n_heads + m.resolved_n_kv_heads
    muon = [
        p.shape
        for opt in parts.optimizers
        if type(opt).__name__ == "Muon"
        for g in opt.param_groups
        for p in g["params"]
    ]
    ns_steps = next(
        (g["ns_steps"] for opt in parts.optimizers if type(opt).__name__ == "Muon" for g in opt.param_groups), 0
    )
    adamw = sum(
        p.numel()
        for opt in parts.optimizers
        if type(opt).__name__ != "Muon"
        for g in opt.param_groups
        for p in g["params"]
    )
    params = sum(p.numel() for p in model.parameters())
    scores = m.n_layers * t.micro_batch_size * t.grad_accum_steps * m.n_heads * t.seq_len**2
    return {
        "matmuls": (6 * n * (matrices - head), "FLOP"),
        "LM head matmuls": (6 * n * head, "FLOP"),
        "attention": (n * 6 * m.n_layers * m.n_heads * m.head_dim * (t.seq_len + 1), "FLOP"),
        NEWTON_SCHULZ: (sum(ns_steps * (4 * min(s) ** 2 * max(s) + 2 * min(s) ** 3) for s in muon), "FLOP"),
        "norms": ((2 * m.n_layers + 1) * 5 * n * d * 4, "B"),  # x, y; x, dy, dx — fp32
        "MLP activation": (m.n_layers * n * f * act * (8 if m.mlp in ("swiglu", "geglu") else 4), "B"),
        "RoPE": (m.n_layers * n * heads * m.head_dim * act * 4, "B"),  # q and k in and out, both passes
        "loss (log-softmax, NLL)": (2 * act * n * m.padded_vocab_size, "B"),  # read the logits, write their gradient
        "softmax, mask": (scores * 5 * 4, "B"),  # scores in, probabilities out; probabilities, their gradient in, out
        "embedding": (4 * n * d * 4, "B"),
        "casts, copies": ((12 if act == 2 else 0) * matrices, "B"),  # fp32 weights to bf16, bf16 gradients back
        "gradient norm, clip": (12 * params, "B"),
        "optimizer: elementwise": (20 * sum(s.numel() for s in muon) + 28 * adamw, "B"),
    }


def copy_bandwidth(mib: int = 256) -> float:
    """Bytes/s of the best of 5 copies of a `mib` MiB fp32 tensor (read + write): the elementwise roof."""
    src = torch.ones(mib * 2**18)
    dst = torch.empty_like(src)
    best = min(timed(lambda: dst.copy_(src)) for _ in range(5))
    return 2 * src.numel() * 4 / best


def newton_schulz_dtype(parts) -> Optional[torch.dtype]:
    """The dtype Muon orthogonalises in (optim.muon_ns_dtype, resolved), or None without Muon."""
    return next((opt.ns_dtype for opt in parts.optimizers if type(opt).__name__ == "Muon"), None)


def roofline(
    groups: dict, wall: float, work: dict, matmul_peak: float, bandwidth: float, group_peaks: Optional[dict] = None
) -> list:
    """Markdown rows: group, ms/step, share, work, achieved, % of its roof; the largest groups first. A matmul
    group's roof is `matmul_peak` (the run's precision) unless `group_peaks` gives its own (Newton–Schulz runs in
    optim.muon_ns_dtype, which need not be the run's)."""
    rows = ["| op group | ms/step | share | work per step | achieved | % of roof |", "|---|---:|---:|---:|---:|---:|"]
    for group, seconds in sorted(groups.items(), key=lambda kv: -kv[1]):
        amount, unit = work.get(group, (None, None))
        if amount and seconds > 0:
            rate = amount / seconds
            roof = (group_peaks or {}).get(group, matmul_peak) if unit == "FLOP" else bandwidth
            scale, name = (1e9, "GFLOP") if unit == "FLOP" else (1e6, "MB")
            cells = (
                f"{amount / scale:,.1f} {name} | {rate / scale / 1e3:.2f} {'T' if unit == 'FLOP' else 'G'}{unit}/s "
                f"| {100 * rate / roof:.0f} %"
            )
        else:
            cells = "— | — | —"
        rows.append(f"| {group} | {1e3 * seconds:.1f} | {100 * seconds / wall:.1f} % | {cells} |")
    rows.append(f"| **step (profiled)** | **{1e3 * wall:.1f}** | 100 % | | | |")
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    inductor_config.cpp.enable_kernel_profile = True  # each compiled kernel a profiler event (a call's cost each)
    variants = {"as configured": args.overrides, **{v: [*args.overrides, *shlex.split(v)] for v in args.variant}}
    built = {name: build_step(overrides) for name, overrides in variants.items()}
    for text in args.inductor_variant:
        built[f"inductor: {text}"] = build_step(args.overrides, inductor_options(text))
    cfg, parts, _ = built["as configured"]
    dtype = torch.bfloat16 if parts.precision == "bf16" else torch.float32
    load_before, peak = os.getloadavg()[0], measure_matmul_flops(torch.device("cpu"), dtype)
    print(
        f"{cpu_model()}, {cpu_bf16()[1]}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"{parts.precision}, compile: {parts.notes[1]}; overrides: {' '.join(args.overrides) or '(the default run)'}"
    )
    tokens = cfg.trainer.micro_batch_size * cfg.trainer.seq_len * cfg.trainer.grad_accum_steps
    times = time_interleaved({name: step for name, (_, _, step) in built.items()}, args.steps, args.warmup)
    base = statistics.median(times["as configured"])
    print(
        f"\n| variant | ms/step (median of {args.steps}) | min–max ms | tokens/s | vs as configured |\n"
        "|---|---:|---:|---:|---:|"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"| {name} | {1e3 * med:.0f} | {1e3 * min(ts):.0f}–{1e3 * max(ts):.0f} | {tokens / med:,.0f} "
            f"| {base / med:.3f}× |"
        )
    if args.profile_steps:
        m = cfg.model
        tokens_per_micro = cfg.trainer.micro_batch_size * cfg.trainer.seq_len
        groups, wall = profile_groups(
            built["as configured"][2], args.profile_steps, (tokens_per_micro, m.hidden_size, m.padded_vocab_size)
        )
        bandwidth = copy_bandwidth()
        peak = max(peak, measure_matmul_flops(torch.device("cpu"), dtype))
        ns_dtype, group_peaks, ns_roof = newton_schulz_dtype(parts), {}, ""
        if ns_dtype is not None and ns_dtype != dtype:
            group_peaks[NEWTON_SCHULZ] = measure_matmul_flops(torch.device("cpu"), ns_dtype)
            ns_roof = (
                f", Newton–Schulz's {str(ns_dtype).removeprefix('torch.')} peak "
                f"{group_peaks[NEWTON_SCHULZ] / 1e12:.3f} TFLOP/s"
            )
        print(
            f"\nroofline of 'as configured' ({args.profile_steps} profiled steps; roofs: {parts.precision} matmul peak "
            f"{peak / 1e12:.3f} TFLOP/s{ns_roof}, copy bandwidth {bandwidth / 1e9:.1f} GB/s)\n"
        )
        print("\n".join(roofline(groups, wall, step_work(cfg, parts), peak, bandwidth, group_peaks)))
    print(f"\nload average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
