"""Training-step throughput of minillama vs Hugging Face LlamaForCausalLM, same shapes, eager and compiled.

Usage: python -m dev.bench model [--shape cpu|25m|125m|tiny] [--compile] [--precision auto|bf16|fp32]
           [--steps 10] [--warmup 3] [--batch 16] [--seq 256] [--vocab 4096] [--heads N] [--threads 2]
           [--optim adamw[,muon]] [--layers 6,4] [--no-hf] [--profile] [--matmul-shapes]
One step = loss (model + fp32 cross-entropy, one module; compiled as one with --compile), backward,
the optimizer step(s) as train.py builds them (fused AdamW; --optim muon: Muon for the block matrices +
AdamW), zero_grad. The variants run interleaved in one process; medians are reported. Muon runs on
minillama only (HF's model has no blocks of ours to find the matrices in). --layers times our model at
several depths side by side: the step cost of a depth change (the speedrun's layers recipes).
"""

import argparse
import os
import re
import statistics
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from dev.bench import measure_matmul_flops, timed
from model import ModelConfig, Transformer
from training.cli import REPO, description
from training.config import OptimConfig
from training.loop import CausalLMLoss, autocast_context, cache_for_this_cpu, resolve_precision
from training.optim import build_optimizers


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--shape", default="cpu", help="configs/model/<shape>.yaml (default: cpu, the CPU default)")
    p.add_argument("--compile", action="store_true", help="also time both models under torch.compile")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant (the median is reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first (compile included)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=None, help="default: the shape's max_seq_len")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--heads", type=int, default=None, help="override n_heads (n_kv_heads follows if it was equal)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--optim", default="adamw", help="comma-separated: adamw, muon (each a variant, side by side)")
    p.add_argument(
        "--layers",
        help="comma-separated depths, each a variant of our model side by side (e.g. 6,4); "
        "ratios are to the first, which HF's model also takes",
    )
    p.add_argument("--no-hf", action="store_true", help="only our model (no transformers needed)")
    p.add_argument("--profile", action="store_true", help="then profile 3 steps of our fastest variant")
    p.add_argument("--matmul-shapes", action="store_true", help="then time each of the model's matmul shapes alone")
    return p.parse_args(argv)


def model_config(shape: str, vocab: int, seq, heads) -> ModelConfig:
    path = REPO / "configs" / "model" / f"{shape}.yaml"
    if not path.is_file():
        raise SystemExit(
            f"error: --shape {shape}: no {path.relative_to(REPO)}; "
            f"choose one of {sorted(p.stem for p in path.parent.glob('*.yaml'))}"
        )
    fields = OmegaConf.to_container(
        OmegaConf.merge({"data": {"vocab_size": vocab}}, {"model": OmegaConf.load(path)}), resolve=True
    )["model"]
    if seq:
        fields["max_seq_len"] = seq
    if heads:
        if fields.get("n_kv_heads") in (None, fields["n_heads"]):
            fields["n_kv_heads"] = None
        fields["n_heads"] = heads
    return ModelConfig(**fields)


class HFLoss(torch.nn.Module):
    """LlamaForCausalLM + the same fp32 cross-entropy as CausalLMLoss's one-shot path, as one module."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        from transformers import LlamaForCausalLM

        from interop.hf_export import llama_config

        hf_cfg = llama_config(cfg, {})
        hf_cfg.use_cache = False
        self.model = LlamaForCausalLM._from_config(hf_cfg, attn_implementation="sdpa")

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids, use_cache=False).logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def make_step(loss_module: torch.nn.Module, compiled: bool, autocast, optim: str = "adamw"):
    """One training step as train.py runs it: autocast opened around the (compiled) loss module."""
    loss_module.train()
    optimizers = build_optimizers(loss_module, OptimConfig(name=optim, lr=1e-4, min_lr=1e-5), "cpu")
    cache_for_this_cpu()
    call = torch.compile(loss_module) if compiled else loss_module

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        with autocast():
            loss = call(inputs, targets)
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def depths(arg, default: int) -> list:
    """--layers 6,4 → [6, 4]; without it, the shape's depth alone."""
    if not arg:
        return [default]
    try:
        found = [int(d) for d in arg.split(",")]
    except ValueError:
        found = []
    if not found or min(found) < 1 or len(set(found)) != len(found):
        raise SystemExit(f"error: --layers {arg}: give distinct depths >= 1, comma-separated, e.g. 6,4")
    return found


def build_variants(cfg: ModelConfig, args, autocast, layers=None) -> dict:
    """Each (mode, optimizer, model) a step function; `layers`: our model at each depth (cfg's is the first)."""
    torch.manual_seed(0)
    layers = layers or [cfg.n_layers]
    modules = {
        "minillama" + (f" L{d}" if len(layers) > 1 else ""): CausalLMLoss(Transformer(replace(cfg, n_layers=d)))
        for d in layers
    }
    if not args.no_hf:
        modules["hf_llama"] = HFLoss(cfg)
        first, hf = next(iter(modules.values())), modules["hf_llama"]  # the same depth (cfg's)
        ours, theirs = (sum(p.numel() for p in module.parameters()) for module in (first, hf))
        assert ours == theirs, f"HF config differs: {ours:,} vs {theirs:,} parameters"  # else it means nothing
    optims = [o.strip() for o in args.optim.split(",")]
    unknown = [o for o in optims if o not in ("adamw", "muon")]
    if unknown:
        raise SystemExit(f"error: --optim {args.optim}: unknown {', '.join(unknown)}; choose from adamw, muon")
    variants = {}
    for mode in ("eager", "compiled") if args.compile else ("eager",):
        for optim in optims:
            for name, module in modules.items():
                if optim == "muon" and not name.startswith("minillama"):
                    continue
                # Each variant trains its own copy: a shared copy would see the other's updates.
                copy = _clone(module) if (mode, optim) != ("eager", optims[0]) else module
                label = f"{name} {mode}" + (f" {optim}" if len(optims) > 1 else "")
                variants[label] = make_step(copy, mode == "compiled", autocast, optim)
    return variants


def _clone(module: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(module)


def time_variants(variants: dict, inputs, targets, args) -> tuple:
    """(seconds per timed step per variant, seconds of the first call per variant)."""
    first = {}
    for name, step in variants.items():
        t0 = time.perf_counter()
        step(inputs, targets)
        first[name] = time.perf_counter() - t0
        for _ in range(args.warmup - 1):
            step(inputs, targets)
    times, names = {name: [] for name in variants}, list(variants)
    for i in range(args.steps):
        # Interleaved, rotating who goes first, so drifts in machine speed hit every variant alike.
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t0 = time.perf_counter()
            variants[name](inputs, targets)
            times[name].append(time.perf_counter() - t0)
    return times, first


def variant_flops(cfg: ModelConfig, name: str) -> float:
    """FLOPs per token of a variant: one at another depth (--layers, "minillama L4 …") does other work."""
    depth = re.match(r"minillama L(\d+) ", name)
    return _meta_model(replace(cfg, n_layers=int(depth.group(1))) if depth else cfg).flops_per_token(cfg.max_seq_len)


def report(cfg: ModelConfig, args, precision: str, times: dict, first: dict, peak: float) -> None:
    tokens = args.batch * cfg.max_seq_len
    flops = variant_flops(cfg, "minillama")  # same matmuls in HF's model
    print(
        f"\nflops_per_token({cfg.max_seq_len}) = {flops / 1e6:.2f} MFLOP at {cfg.n_layers} layers (6·N_matmul + "
        f"causal attention); peak = best {precision} matmul, {peak / 1e12:.3f} TFLOP/s"
    )
    print(
        f"| variant | ms/step (median of {args.steps}) | min–max ms | tokens/s | TFLOP/s | % of {precision} "
        f"matmul peak | first step s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    tps = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        tps[name] = tokens / median
        achieved = tps[name] * variant_flops(cfg, name)
        print(
            f"| {name} | {median * 1e3:.0f} | {min(ts) * 1e3:.0f}–{max(ts) * 1e3:.0f} | {tps[name]:,.0f} "
            f"| {achieved / 1e12:.3f} | {100 * achieved / peak:.1f} % | {first[name]:.1f} |"
        )
    for mode in ("eager", "compiled"):
        ours = (
            f"minillama L{cfg.n_layers} {mode}" if f"minillama L{cfg.n_layers} {mode}" in tps else f"minillama {mode}"
        )
        if f"hf_llama {mode}" in tps and ours in tps:
            print(f"minillama / HF, {mode}: {tps[ours] / tps[f'hf_llama {mode}']:.3f}")
    for name in tps:
        if name.startswith("minillama") and name.endswith(" muon") and name[:-5] + " adamw" in tps:
            print(f"{name[:-5]}, step time muon / adamw: {tps[name[:-5] + ' adamw'] / tps[name]:.3f}")
    groups = {}  # "compiled muon" → [(depth label, tokens/s)] in --layers order: the first is the base
    for name in tps:
        if re.match(r"minillama L\d+ ", name):
            _, depth, rest = name.split(" ", 2)
            groups.setdefault(rest, []).append((depth, tps[name]))
    for rest, rows in groups.items():
        for depth, tokens_per_s in rows[1:]:
            print(f"minillama {rest}, step time {depth} / {rows[0][0]}: {rows[0][1] / tokens_per_s:.3f}")
    for name in ("minillama", "hf_llama"):
        if f"{name} compiled" in tps:
            print(f"{name} compiled / eager: {tps[f'{name} compiled'] / tps[f'{name} eager']:.3f}")


def _meta_model(cfg: ModelConfig) -> Transformer:
    with torch.device("meta"):
        return Transformer(cfg)


def profile(step, inputs, targets, rows: int = 25) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step(inputs, targets)
    print("\nprofile of 3 steps (self CPU time):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60))


def matmul_shapes(cfg: ModelConfig, tokens: int, dtype: torch.dtype, peak: float) -> None:
    """Each distinct Linear of the model as one (tokens × in) @ (in × out) matmul, alone: how close the
    model's own shapes come to the square-matmul peak (small inner sizes keep it below)."""
    shapes = sorted({tuple(m.weight.shape) for m in _meta_model(cfg).modules() if isinstance(m, torch.nn.Linear)})
    print(f"\n| matmul ({tokens} tokens) | TFLOP/s | % of peak |\n|---|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for out_features, in_features in shapes:
        x = torch.randn(tokens, in_features, generator=gen).to(dtype)
        w = torch.randn(out_features, in_features, generator=gen).to(dtype)
        best = min(timed(lambda: x @ w.T) for _ in range(5))
        flops = 2 * tokens * in_features * out_features / best
        print(
            f"| {tokens} × {in_features} @ {in_features} × {out_features} | {flops / 1e12:.3f} "
            f"| {100 * flops / peak:.0f} % |"
        )


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    cfg = model_config(args.shape, args.vocab, args.seq, args.heads)
    layers = depths(args.layers, cfg.n_layers)
    cfg = replace(cfg, n_layers=layers[0])  # HF's model and the header: the first depth
    precision, why = resolve_precision(args.precision, device)
    autocast = autocast_context(precision, device)
    variants = build_variants(cfg, args, autocast, layers)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, cfg.vocab_size, (args.batch, cfg.max_seq_len + 1), generator=gen)
    inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    hf_version = "" if args.no_hf else f", transformers {__import__('transformers').__version__}"
    print(
        f"torch {torch.__version__}{hf_version}, {torch.get_num_threads()} threads, {precision} ({why}), "
        f"batch {args.batch} × seq {cfg.max_seq_len}; shape {args.shape}: hidden {cfg.hidden_size}, "
        f"{','.join(map(str, layers))} layers, {cfg.n_heads} heads ({cfg.resolved_n_kv_heads} kv) of {cfg.head_dim}, "
        f"MLP {cfg.resolved_intermediate_size}, vocab {cfg.padded_vocab_size}, "
        f"{_meta_model(cfg).param_counts()['total']:,} parameters"
    )
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    load_before, peak = os.getloadavg()[0], measure_matmul_flops(device, dtype)
    times, first = time_variants(variants, inputs, targets, args)
    peak = max(peak, measure_matmul_flops(device, dtype))  # before and after: the best the machine showed
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    report(cfg, args, precision, times, first, peak)
    if args.matmul_shapes:
        matmul_shapes(cfg, args.batch * cfg.max_seq_len, dtype, peak)
    if args.profile:
        fastest = min((n for n in times if n.startswith("minillama")), key=lambda n: statistics.median(times[n]))
        print(f"\nprofiling {fastest}")
        profile(variants[fastest], inputs, targets)
