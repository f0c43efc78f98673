"""Training-step time of minillama vs Hugging Face LlamaForCausalLM at the same shape, and of our model with Muon
beside AdamW (--optim) or at several depths (--layers), side by side in one process.

One step = loss (model + fp32 cross-entropy, one module; compiled as one with --compile), backward, the optimizer
step(s) as train.py builds them (fused AdamW; muon: Muon for the block matrices + AdamW), zero_grad, in the precision
trainer.precision=auto picks. The variants run interleaved and the medians are reported; Muon and the extra depths
run on our model only.
"""

import argparse
import copy
import os
import statistics
from dataclasses import replace

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from dev.bench import machine, measure_matmul_flops, timed
from model import ModelConfig, Transformer
from training.config import OptimConfig
from training.loop import CausalLMLoss, autocast_context, cache_for_this_cpu, resolve_precision
from training.optim import build_optimizers
from training.program import REPO, description

VOCAB = 4096  # the default run's


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--shape", default="cpu", help="configs/model/<shape>.yaml (default: cpu, the CPU default)")
    p.add_argument("--compile", action="store_true", help="also time every variant under torch.compile")
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant (the median is reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first (compile included)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=None, help="override n_heads (n_kv_heads follows if it was equal)")
    p.add_argument("--optim", default="adamw", help="comma-separated: adamw, muon (each a variant, side by side)")
    p.add_argument("--layers", help="comma-separated depths of our model, e.g. 6,4: ratios are to the first")
    p.add_argument("--no-hf", action="store_true", help="only our model (no transformers needed)")
    return p.parse_args(argv)


def model_config(shape: str, heads=None) -> ModelConfig:
    path = REPO / "configs" / "model" / f"{shape}.yaml"
    if not path.is_file():
        raise SystemExit(
            f"error: --shape {shape}: no {path.relative_to(REPO)}; "
            f"choose one of {sorted(p.stem for p in path.parent.glob('*.yaml'))}"
        )
    merged = OmegaConf.merge({"data": {"vocab_size": VOCAB}}, {"model": OmegaConf.load(path)})
    fields = OmegaConf.to_container(merged, resolve=True)["model"]
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


def make_step(loss_module: torch.nn.Module, compiled: bool, autocast, optim: str):
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


def choices(args, depth: int) -> tuple:
    """(depths, optimizers) of --layers and --optim, or one error line."""
    try:
        layers = [int(d) for d in args.layers.split(",")] if args.layers else [depth]
    except ValueError:
        layers = []
    if not layers or min(layers) < 1 or len(set(layers)) != len(layers):
        raise SystemExit(f"error: --layers {args.layers}: give distinct depths >= 1, comma-separated, e.g. 6,4")
    optims = [o.strip() for o in args.optim.split(",")]
    if not set(optims) <= {"adamw", "muon"} or len(set(optims)) != len(optims):
        raise SystemExit(f"error: --optim {args.optim}: give distinct optimizers of adamw, muon, comma-separated")
    return layers, optims


def build_variants(cfg: ModelConfig, layers: list, optims: list, modes: list, hf: bool, autocast) -> dict:
    """{(model, depth, mode, optimizer): step}; HF's model at the first depth with AdamW only (it has no blocks of ours
    for Muon to find the matrices in)."""
    torch.manual_seed(0)
    modules = {("minillama", d): CausalLMLoss(Transformer(replace(cfg, n_layers=d))) for d in layers}
    if hf:
        modules["hf_llama", layers[0]] = HFLoss(replace(cfg, n_layers=layers[0]))
        ours, theirs = (sum(p.numel() for p in modules[m, layers[0]].parameters()) for m in ("minillama", "hf_llama"))
        assert ours == theirs, f"HF config differs: {ours:,} vs {theirs:,} parameters"  # else it means nothing
    variants = {}
    for mode in modes:
        for optim in optims:
            for (name, depth), module in modules.items():
                if optim == "muon" and name == "hf_llama":
                    continue
                # Each variant trains its own copy: a shared copy would see the other's updates.
                own = module if (mode, optim) == (modes[0], optims[0]) else copy.deepcopy(module)
                variants[name, depth, mode, optim] = make_step(own, mode == "compiled", autocast, optim)
    return variants


def time_variants(variants: dict, inputs, targets, steps: int, warmup: int) -> dict:
    """Seconds of each timed step, per variant."""
    for step in variants.values():
        for _ in range(warmup):
            step(inputs, targets)
    times, keys = {key: [] for key in variants}, list(variants)
    for i in range(steps):
        # Interleaved, rotating who goes first, so drifts in machine speed hit every variant alike.
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
            times[key].append(timed(lambda: variants[key](inputs, targets)))
    return times


def label(key: tuple, layers: list, optims: list) -> str:
    """("minillama", 4, "eager", "muon") → "minillama L4 eager muon", naming depth and optimizer only where they vary."""
    name, depth, mode, optim = key
    depth_label = f" L{depth}" if len(layers) > 1 and name == "minillama" else ""
    return f"{name}{depth_label} {mode}" + (f" {optim}" if len(optims) > 1 else "")


def report(cfg, layers, optims, times: dict, tokens: int, precision: str, peak: float) -> None:
    flops = {d: _meta_model(replace(cfg, n_layers=d)).flops_per_token(cfg.max_seq_len) for d in layers}
    print(
        f"\nflops_per_token({cfg.max_seq_len}) = {flops[layers[0]] / 1e6:.2f} MFLOP at {layers[0]} layers "
        f"(6·N_matmul + causal attention); peak = best {precision} matmul, {peak / 1e12:.3f} TFLOP/s"
    )
    print(
        f"| variant | ms/step (median of {len(next(iter(times.values())))}) | min–max ms | tokens/s | TFLOP/s "
        f"| % of {precision} matmul peak |\n|---|---:|---:|---:|---:|---:|"
    )
    tps = {key: tokens / statistics.median(ts) for key, ts in times.items()}
    for key, ts in times.items():
        achieved = tps[key] * flops[key[1]]  # HF's model does the same matmuls as ours
        print(
            f"| {label(key, layers, optims)} | {statistics.median(ts) * 1e3:.0f} | {min(ts) * 1e3:.0f}–"
            f"{max(ts) * 1e3:.0f} | {tps[key]:,.0f} | {achieved / 1e12:.3f} | {100 * achieved / peak:.1f} % |"
        )
    for (name, depth, mode, optim), value in tps.items():
        hf = tps.get(("hf_llama", depth, mode, optim))
        if name == "minillama" and hf:
            print(f"minillama / HF, {mode}: {value / hf:.3f}")
        if optim == "muon" and (name, depth, mode, "adamw") in tps:
            adamw = label((name, depth, mode, "adamw"), layers, [optim])
            print(f"{adamw}, step time muon / adamw: {tps[name, depth, mode, 'adamw'] / value:.3f}")
        if depth != layers[0] and name == "minillama":
            rest = label((name, depth, mode, optim), [depth], optims)
            print(f"{rest}, step time L{depth} / L{layers[0]}: {tps[name, layers[0], mode, optim] / value:.3f}")


def _meta_model(cfg: ModelConfig) -> Transformer:
    with torch.device("meta"):
        return Transformer(cfg)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device("cpu")
    cfg = model_config(args.shape, args.heads)
    layers, optims = choices(args, cfg.n_layers)
    cfg = replace(cfg, n_layers=layers[0])  # HF's model and the header: the first depth
    precision, why = resolve_precision("auto", device)
    modes = ["eager", "compiled"] if args.compile else ["eager"]
    variants = build_variants(cfg, layers, optims, modes, not args.no_hf, autocast_context(precision, device))
    data = torch.randint(
        0, cfg.vocab_size, (args.batch, cfg.max_seq_len + 1), generator=torch.Generator().manual_seed(0)
    )
    hf_version = "" if args.no_hf else f", transformers {__import__('transformers').__version__}"
    print(
        f"{machine()}{hf_version}, {precision} ({why}), batch {args.batch} × seq {cfg.max_seq_len}; shape "
        f"{args.shape}: hidden {cfg.hidden_size}, {','.join(map(str, layers))} layers, {cfg.n_heads} heads "
        f"({cfg.resolved_n_kv_heads} kv) of {cfg.head_dim}, MLP {cfg.resolved_intermediate_size}, "
        f"vocab {cfg.padded_vocab_size}, {_meta_model(cfg).param_counts()['total']:,} parameters"
    )
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    load_before, peak = os.getloadavg()[0], measure_matmul_flops(device, dtype)
    times = time_variants(variants, data[:, :-1].contiguous(), data[:, 1:].contiguous(), args.steps, args.warmup)
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    report(cfg, layers, optims, times, args.batch * cfg.max_seq_len, precision, peak)
