"""Generation speed: minillama with and without the KV cache vs HF `generate` on the exported copy, same run.

Usage: python -m dev.bench generate [--checkpoint CKPT] [--new-tokens 256] [--prompt-tokens 16] [--repeats 3]
       [--threads 2] [--device cpu|cuda] [--no-hf] [--write]   (--write: update BENCHMARKS.md)
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Optional

import torch

from dev.bench import cpu_model
from dev.bench.benchmarks_doc import write_section
from interop.hf_export import export_checkpoint, llama_config, to_hf_state_dict
from model import ModelConfig, Transformer
from model.generate import generate_ids
from training.checkpoint import load_model
from training.cli import REPO, description

SECTION = "## Generation (dev/bench/generate.py)"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--checkpoint", help="benchmark this checkpoint (default: a random model of the cpu config)")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method, interleaved; the median counts")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face (no transformers needed)")
    p.add_argument("--write", action="store_true", help=f"replace the '{SECTION}' section of BENCHMARKS.md")
    return p.parse_args(argv)


def build_model(args) -> Transformer:
    if args.checkpoint:
        return load_model(args.checkpoint, device=args.device)[0]
    torch.manual_seed(0)
    # configs/model/cpu.yaml with a 4096-token vocabulary; context long enough for prompt + new tokens.
    cfg = ModelConfig(
        vocab_size=4096,
        hidden_size=256,
        n_layers=6,
        n_heads=4,
        multiple_of=32,
        max_seq_len=max(512, args.prompt_tokens + args.new_tokens),
    )
    return Transformer(cfg).to(args.device).eval()


def hf_copy(model: Transformer, checkpoint: Optional[str]):
    """LlamaForCausalLM with the same weights: a checkpoint goes through scripts/export_hf.py's export
    and from_pretrained; the random model (no tokenizer to export) through the same mapping in memory."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    device = model.embed_tokens.weight.device
    if checkpoint:
        with tempfile.TemporaryDirectory(prefix="bench_generate_") as tmp:
            out = export_checkpoint(checkpoint, f"{tmp}/hf")
            return AutoModelForCausalLM.from_pretrained(out).to(device).eval()
    hf = LlamaForCausalLM(llama_config(model.cfg, {})).to(device).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model.state_dict(), model.cfg), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return hf


def methods(model, hf, prompt: torch.Tensor, n: int) -> dict:
    """name → function generating exactly n greedy tokens after prompt (1, T) and returning them."""
    ids = [prompt[0].tolist()]
    out = {
        "minillama + KV cache": lambda: generate_ids(model, ids, n, temperature=0)[0],
        "minillama, no cache (recompute)": lambda: generate_ids(model, ids, n, temperature=0, use_cache=False)[0],
    }
    if hf is not None:
        mask = torch.ones_like(prompt)
        out["HF generate (exported copy)"] = lambda: hf.generate(
            prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )[0, prompt.shape[1] :].tolist()
    return out


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model = build_model(args)
    device = model.embed_tokens.weight.device
    hf = None if args.no_hf else hf_copy(model, args.checkpoint)
    prompt = torch.randint(
        3, model.cfg.vocab_size, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0)
    ).to(device)
    runs = methods(model, hf, prompt, args.new_tokens)
    outputs = {name: fn() for name, fn in runs.items()}  # warm-up, and all must agree token for token
    reference = outputs["minillama + KV cache"]
    agree = {name: out == reference for name, out in outputs.items()}
    times, load_before = {name: [] for name in runs}, os.getloadavg()[0]
    for _ in range(args.repeats):
        for name, fn in runs.items():  # interleaved, so drifting machine load hits every method alike
            times[name].append(timed(fn, device))
    report = format_report(args, model, times, agree, (load_before, os.getloadavg()[0]))
    print(report)
    if args.write:
        write_section(REPO / "BENCHMARKS.md", SECTION, report)
        print("wrote BENCHMARKS.md", file=sys.stderr)


def format_report(args, model, times: dict, agree: dict, load: tuple) -> str:
    n, cfg = args.new_tokens, model.cfg
    speed = {name: n / statistics.median(ts) for name, ts in times.items()}
    ours = speed["minillama + KV cache"]
    hf_version = "" if args.no_hf else f", transformers {__import__('transformers').__version__}"
    lines = [
        f"`{' '.join(['python -m dev.bench generate', *sys.argv[1:]])}`",
        "",
        f"{time.strftime('%Y-%m-%d')}, {cpu_model()}, {args.device}, torch {torch.__version__}{hf_version}, "
        f"{args.threads} threads, batch 1, fp32, greedy; prompt {args.prompt_tokens} tokens, {n} new tokens (prefill included); model hidden "
        f"{cfg.hidden_size}, {cfg.n_layers} layers, {cfg.n_heads} heads, vocab {cfg.vocab_size}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters; median of {args.repeats} "
        f"interleaved runs; load average {load[0]:.1f} before, {load[1]:.1f} after (other jobs share the cores).",
        "",
        "| method | tokens/s | minillama + KV cache is faster by | same tokens as KV cache |",
        "| --- | ---: | ---: | :---: |",
    ]
    for name, tps in speed.items():
        lines.append(f"| {name} | {tps:.1f} | {ours / tps:.2f}× | {'yes' if agree[name] else 'NO'} |")
    return "\n".join(lines)
