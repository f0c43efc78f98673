"""Generation speed: minillama with and without the KV cache vs HF `generate` on an exported copy of the same weights,
greedy, batch 1, on a random model of the cpu shape of 2026-11 (hidden 256, 6 layers); --write records the table in
BENCHMARKS.md."""

import argparse
import os
import statistics
import sys

import torch

from dev.bench import machine, timed
from dev.bench.benchmarks_doc import write_section
from interop.hf_export import llama_config, to_hf_state_dict
from model import ModelConfig, Transformer
from model.generate import generate_ids
from training.program import REPO, description

SECTION = "## Generation (dev/bench/generate.py)"
PROMPT_TOKENS, NEW_TOKENS = 16, 256


def hf_copy(model: Transformer):
    """LlamaForCausalLM with the same weights, through scripts/export_hf.py's mapping."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM(llama_config(model.cfg, {})).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model.state_dict(), model.cfg), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied to the embedding
    return hf


def methods(model: Transformer, prompt: torch.Tensor, n: int) -> dict:
    """name → function generating exactly n greedy tokens after prompt (1, T) and returning them."""
    ids, hf, mask = [prompt[0].tolist()], hf_copy(model), torch.ones_like(prompt)
    return {
        "minillama + KV cache": lambda: generate_ids(model, ids, n, temperature=0)[0],
        "minillama, no cache (recompute)": lambda: generate_ids(model, ids, n, temperature=0, use_cache=False)[0],
        "HF generate (exported copy)": lambda: hf.generate(
            prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )[0, prompt.shape[1] :].tolist(),
    }


def measure(model: Transformer, n: int, repeats: int) -> str:
    """The markdown report: each method's tokens/s (median of `repeats` interleaved runs) and whether its tokens equal
    the KV cache's."""
    prompt = torch.randint(3, model.cfg.vocab_size, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    runs = methods(model, prompt, n)
    outputs = {name: fn() for name, fn in runs.items()}  # warm-up, and all must agree token for token
    times, load_before = {name: [] for name in runs}, os.getloadavg()[0]
    for _ in range(repeats):
        for name, fn in runs.items():  # interleaved, so drifting machine load hits every method alike
            times[name].append(timed(fn))
    speed = {name: n / statistics.median(ts) for name, ts in times.items()}
    cfg = model.cfg
    lines = [
        f"{machine()}, transformers {__import__('transformers').__version__}, batch 1, fp32, greedy; prompt "
        f"{PROMPT_TOKENS} tokens, {n} new tokens (prefill included); model hidden {cfg.hidden_size}, {cfg.n_layers} "
        f"layers, {cfg.n_heads} heads, vocab {cfg.vocab_size}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
        f"parameters; median of {repeats} interleaved runs; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after (other jobs share the cores).",
        "",
        "| method | tokens/s | minillama + KV cache is faster by | same tokens as KV cache |",
        "| --- | ---: | ---: | :---: |",
    ]
    for name, tps in speed.items():
        same = "yes" if outputs[name] == outputs["minillama + KV cache"] else "NO"
        lines.append(f"| {name} | {tps:.1f} | {speed['minillama + KV cache'] / tps:.2f}× | {same} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method, interleaved; the median counts")
    p.add_argument("--write", action="store_true", help=f"replace the '{SECTION}' section of BENCHMARKS.md")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=4096, hidden_size=256, n_layers=6, n_heads=4, multiple_of=32, max_seq_len=512)
    report = f"`python -m dev.bench generate {' '.join(argv)}`\n\n" + measure(
        Transformer(cfg).eval(), NEW_TOKENS, args.repeats
    )
    print(report)
    if args.write:
        write_section(REPO / "BENCHMARKS.md", SECTION, report)
        print("wrote BENCHMARKS.md", file=sys.stderr)
