"""Print a model config's parameter breakdown, training FLOPs per token, and the SwiGLU width reasoning.

Usage: python scripts/model_summary.py [model=cpu|tiny|25m|125m] [hidden_size=4096 multiple_of=256 ...]
Overrides may be written `key=value` or `model.key=value`; `vocab_size=`/`data.vocab_size=` sets the vocab.
"""

import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import _bootstrap  # noqa: F401  (the repository root on sys.path; TORCHINDUCTOR_CACHE_DIR checked)
import torch
from omegaconf import OmegaConf

from model import MLPS, ModelConfig, Transformer, swiglu_intermediate_size
from training.program import REPO, compose, run

MODEL_CONFIGS = REPO / "configs" / "model"


def load_model_config(argv: List[str]) -> Tuple[ModelConfig, Path]:
    """configs/model/<name>.yaml + overrides (`key=value` on the model, `vocab_size=` on the data) → a validated
    ModelConfig, composed and checked as train.py composes it."""
    name, overrides = "cpu", []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {arg!r} (see --help)")
        key = key.removeprefix("+").removeprefix("model.")
        if key == "model":
            name = value
        elif key in ("vocab_size", "data.vocab_size"):  # the yamls take it from ${data.vocab_size}
            overrides.append(f"data.vocab_size={value}")
        else:
            overrides.append(f"model.{key}={value}")
    model = OmegaConf.to_object(compose([f"model={name}", *overrides]).model)  # model=25M: "did you mean model=25m?"
    return model, MODEL_CONFIGS / f"{name}.yaml"


def config_fields(cfg: ModelConfig) -> dict:
    """The fields as set, with the value each unset (derived) one resolves to."""
    fields = dict(vars(cfg))
    for name, value in (("n_kv_heads", cfg.resolved_n_kv_heads), ("intermediate_size", cfg.resolved_intermediate_size)):
        if fields[name] is None:
            fields[name] = f"{value} (derived)"
    return fields


def print_param_table(model: Transformer) -> None:
    counts, cfg = model.param_counts(), model.cfg
    total = counts["total"]
    print(f"\nParameters by module type ({cfg.depth})")
    print(f"  {'module':<12}{'params':>15}{'share':>9}  per layer")
    final_norm = sum(p.numel() for p in model.norm.parameters())  # 0 with norm=none, 2·d with layernorm
    per_layer = {"attention": counts["attention"], "mlp": counts["mlp"], "norm": counts["norm"] - final_norm}
    for kind in ("embedding", "attention", "mlp", "norm", "lm_head"):
        note = f"{per_layer[kind] // cfg.n_layers:,}" if kind in per_layer else ""
        if kind == "lm_head" and cfg.tie_embeddings:
            note = "tied: shares the embedding matrix"
        print(f"  {kind:<12}{counts[kind]:>15,}{100 * counts[kind] / total:>8.1f}%  {note}")
    print(f"  {'total':<12}{total:>15,}{100.0:>8.1f}%")
    print(f"  non-embedding: {total - counts['embedding'] - counts['lm_head']:,}")
    padding = cfg.padded_vocab_size - cfg.vocab_size
    print(
        f"  vocabulary: {cfg.vocab_size:,} token ids → {cfg.padded_vocab_size:,} embedding rows "
        f"(rounded up to a multiple of vocab_multiple={cfg.vocab_multiple}; {padding} padding rows)"
    )
    seq = cfg.max_seq_len
    weights, attention = model.token_flops(seq)  # the same accounting as MFU (model/transformer.py)
    print(
        f"\nTraining FLOPs per token at seq_len {seq}: {(weights + attention) / 1e6:,.2f} M = 6·N_matmul "
        f"{weights / 1e6:,.2f} M + causal attention {attention / 1e6:,.2f} M"
    )


def print_mlp_width(cfg: ModelConfig) -> None:
    d, size = cfg.hidden_size, cfg.resolved_intermediate_size
    gated = [kind for kind, mlp in MLPS.items() if mlp.gated]  # the 8/3·d rule's kinds
    print(f"\nMLP width (mlp={cfg.mlp}, hidden_size d={d}, multiple_of={cfg.multiple_of})")
    if cfg.mlp in gated:
        # Every number below comes from model/mlp.py's rule; multiple_of=1 shows it before rounding.
        truncated = swiglu_intermediate_size(d, 1)
        print(f"  theoretical 8/3·d = {8 * d / 3:.2f}: a 4d MLP has 2 matrices (8·d² weights); a gated one has 3")
        print("    (gate, up, down), so 3·d·I = 8·d² gives I = 8d/3")
        print(f"  int(8d/3) = {truncated}")
        if cfg.ffn_dim_multiplier is not None:
            truncated = swiglu_intermediate_size(d, 1, cfg.ffn_dim_multiplier)
            print(f"  × ffn_dim_multiplier {cfg.ffn_dim_multiplier} → {truncated} (truncated)")
        rule = swiglu_intermediate_size(d, cfg.multiple_of, cfg.ffn_dim_multiplier)
        print(
            f"  rounded UP to a multiple of {cfg.multiple_of} → {rule} (+{rule - truncated}): matmul sizes that are"
            " multiples of\n    32/64/256 fill hardware tiles evenly; rounding up, never down, keeps at least"
            " the intended capacity"
        )
        if cfg.intermediate_size is not None and size != rule:
            print(f"  intermediate_size={size} is set explicitly and overrides the rule's {rule}")
        mlp_params = 3 * d * size
        print(f"  intermediate_size = {size}")
    else:
        print(
            f"  two matrices (up, down) with intermediate_size = {size}"
            f"{' (4·d)' if size == 4 * d else ''}; the 8/3 rule applies only to gated MLPs {gated}"
        )
        mlp_params = 2 * d * size
    classic = 8 * d * d
    print(
        f"  per layer: this MLP {mlp_params:,} params vs a 4d GELU MLP 2·d·4d = 8·d² = {classic:,}"
        f" → ratio {mlp_params / classic:.3f}"
    )


def print_parametrization(cfg: ModelConfig) -> None:
    """Which parametrization, and under mup what it scales (model/config.py, docs/mup.md)."""
    print(f"\nParametrization: {cfg.describe_parametrization()}")
    if cfg.parametrization == "sp":
        print(f"  every matrix at init std {cfg.init_std:g}, one lr for all (model.parametrization=mup: the best lr")
        print("  stays put as hidden_size grows, docs/mup.md)")
        return
    m, hd = cfg.width_multiplier, cfg.head_dim
    block_std = cfg.init_std * cfg.hidden_init_scale
    print(
        f"  blocks' matrices: init std {cfg.init_std:g} × 1/sqrt(m) = {block_std:.4g}"
        f"{' (queries 0: model.zero_query_init)' if cfg.zero_query_init else ''}; "
        "AdamW lr × 1/m, Muon lr × 1/sqrt(m)"
    )
    if cfg.attention_scale is None:  # the experiment's arm (docs/mup.md)
        print(f"  attention: q·k × 1/sqrt(head_dim {hd}) = {hd**-0.5:.4g}, sp's (model.mup_attention_scale=sp)")
    else:
        print(
            f"  attention: q·k × sqrt(base head_dim {(cfg.head_dim / cfg.width_multiplier):g}) / head_dim {hd} = "
            f"{cfg.attention_scale:.4g} (sp: 1/sqrt({hd}) = {hd**-0.5:.4g})"
        )
    print(f"  logits: the LM head's input × 1/m = {1 / m:.4g}; embedding, head and norms keep init and lr")
    if not float((cfg.head_dim / cfg.width_multiplier)).is_integer():
        print(
            f"  warning: the base width {cfg.mup_base_width} is not a multiple of n_heads={cfg.n_heads}, so no base "
            f"model has this head_dim ({(cfg.head_dim / cfg.width_multiplier):g}); μP still scales, but its base is not a model you "
            f"could train: pick a mup_base_width that n_heads divides"
        )


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    cfg, path = load_model_config(argv)  # a ValueError (a bad argument or model value): one error line
    with torch.device("meta"):  # shapes only: even a 7B summary is instant and allocates nothing
        model = Transformer(cfg)
    print(f"Model config {os.path.relpath(path, REPO)} with overrides {argv or 'none'}")
    print("  " + ", ".join(f"{k}={v}" for k, v in config_fields(cfg).items()))
    print_param_table(model)
    print_mlp_width(cfg)
    print_parametrization(cfg)
    return 0


if __name__ == "__main__":
    run(main)
