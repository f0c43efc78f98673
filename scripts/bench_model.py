"""Training-step throughput of minillama's Transformer vs Hugging Face LlamaForCausalLM, same config, same run.

Usage: python scripts/bench_model.py [--steps 10] [--warmup 3] [--batch 16] [--seq 256] [--threads 2]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from model import ModelConfig, Transformer  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per model (the median is reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--no-hf", action="store_true", help="only our model (no transformers needed)")
    return p.parse_args()


def matmul_peak_flops(n: int = 2048, repeats: int = 10) -> float:
    """Best-of-N bf16 n×n matmul FLOP/s: the practical ceiling the MFU fraction is measured against."""
    a, b = torch.randn(n, n, dtype=torch.bfloat16), torch.randn(n, n, dtype=torch.bfloat16)
    for _ in range(3):  # let oneDNN pick and cache its kernel
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def build_hf(cfg: ModelConfig) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False, use_cache=False)
    return LlamaForCausalLM._from_config(hf_cfg, attn_implementation="sdpa")


def make_step(model: torch.nn.Module, is_hf: bool, vocab_size: int):
    """One training step as train.py will run it: bf16 autocast forward, fp32 loss, backward, AdamW."""
    model.train()
    # fused AdamW on CPU needs a recent torch; foreach is the fallback that is everywhere.
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(inputs, use_cache=False).logits if is_hf else model(inputs)
        # Loss in fp32: log-softmax over a 4k vocab in bf16 is visibly noisy.
        loss = F.cross_entropy(logits.float().view(-1, vocab_size), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, n_layers=args.layers, n_heads=args.heads,
                      multiple_of=32, max_seq_len=args.seq)
    ours = Transformer(cfg)
    steps = {"minillama": make_step(ours, False, cfg.vocab_size)}
    if not args.no_hf:
        hf = build_hf(cfg)
        # Same architecture, same size: otherwise the comparison means nothing.
        assert sum(p.numel() for p in hf.parameters()) == ours.param_counts()["total"], "HF config differs"
        steps["hf_llama"] = make_step(hf, True, cfg.vocab_size)

    data = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1))
    inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch} × seq {args.seq}, "
          f"config {cfg}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    peak = matmul_peak_flops()

    for name, step in steps.items():
        for _ in range(args.warmup):
            step(inputs, targets)
    times = {name: [] for name in steps}
    names = list(steps)
    for i in range(args.steps):
        # Interleave, alternating who goes first, so drifts in machine speed hit both models alike.
        for name in (names if i % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            steps[name](inputs, targets)
            times[name].append(time.perf_counter() - t0)

    peak = max(peak, matmul_peak_flops())  # before and after: the best the machine showed
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"measured bf16 matmul peak (2048³, best of 10, before and after): {peak / 1e12:.3f} TFLOP/s")

    tokens = args.batch * args.seq
    flops_per_token = ours.flops_per_token(args.seq)  # same matmuls in HF's model: same FLOPs
    print(f"\nflops_per_token({args.seq}) = {flops_per_token / 1e6:.2f} MFLOP; params {ours.param_counts()['total']:,}")
    print(f"| model | ms/step (median of {args.steps}) | min–max ms | tokens/s | TFLOP/s | % of bf16 matmul peak |")
    print("|---|---:|---:|---:|---:|---:|")
    medians = {}
    for name in names:
        medians[name] = statistics.median(times[name])
        tps = tokens / medians[name]
        achieved = tps * flops_per_token
        spread = f"{min(times[name]) * 1e3:.0f}–{max(times[name]) * 1e3:.0f}"
        print(f"| {name} | {medians[name] * 1e3:.0f} | {spread} | {tps:,.0f} | {achieved / 1e12:.3f} "
              f"| {100 * achieved / peak:.1f} % |")
    if "hf_llama" in medians:
        print(f"\nratio minillama / hf_llama tokens/s: {medians['hf_llama'] / medians['minillama']:.3f}")


if __name__ == "__main__":
    main()
