"""The protocol's cells as train.py configs, through Hydra's compose API: every (size, variant) is
composed and its model built (on the meta device) before anything trains — a typo fails in seconds,
not an hour in — giving the parameter counts and each size's workload for the cost estimate."""
from typing import Dict, List, Tuple

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from analysis.cost import Budget
from cli.config import compose_train_config
from analysis.protocol import ProtocolError, Spec
from model import Transformer
from training.config import TrainConfig

UNKNOWN_EVAL_WINDOWS = 256  # trainer.eval_windows=all: the split's size is only known once data is prepared


def compose_config(overrides: List[str]) -> TrainConfig:
    """The typed config train.py would run with these command-line overrides."""
    return compose_train_config(overrides)[0]


def validate(spec: Spec) -> Tuple[Dict[str, Dict[str, dict]], Dict[str, Budget]]:
    """({size: {variant: parameter counts}}, {size: the reference's workload}); a cell that would not
    compose or build is a ProtocolError naming it."""
    _check_overlaps(spec)
    models, budgets = {}, {}
    for size, size_overrides in spec.sizes.items():
        models[size] = {}
        for variant, variant_overrides in spec.variants.items():
            lr = spec.lr_grid[0]
            overrides = [*([f"experiment={spec.experiment}"] if spec.experiment else []), *spec.train_overrides,
                         *size_overrides, *variant_overrides, f"optim.lr={lr}",
                         f"optim.min_lr={lr * spec.min_lr_ratio}"]
            try:
                cfg = compose_config(overrides)
                with torch.device("meta"):  # shapes only: no memory, instant
                    counts = Transformer(cfg.model).param_counts()
            except (HydraException, OmegaConfBaseException, ValueError, TypeError) as e:
                raise ProtocolError(f"size {size}, variant {variant} does not compose ({' '.join(overrides)}): "
                                    f"{str(e).strip().splitlines()[0]}")
            models[size][variant] = {"total": counts["total"], "mlp": counts["mlp"],
                                     "intermediate_size": cfg.model.resolved_intermediate_size}
            if variant == spec.reference:
                budgets[size] = budget_of(cfg)
    return models, budgets


def budget_of(cfg: TrainConfig) -> Budget:
    t = cfg.trainer
    windows = t.num_eval_windows or UNKNOWN_EVAL_WINDOWS
    return Budget(t.max_steps, t.micro_batch_size * t.seq_len * t.grad_accum_steps, t.eval_interval,
                  windows * t.seq_len)


def cell_values(spec: Spec) -> Dict[Tuple[str, str], dict]:
    """{(size, variant): nested config values} for the cells' generated configs, parsed by Hydra's
    own override grammar (model.qk_norm=true → True, 1e-3 → 0.001) so they mean what they would
    mean on the command line."""
    parsed = {name: _values(overrides, name) for name, overrides in [*spec.sizes.items(), *spec.variants.items()]}
    return {(size, variant): _merge(parsed[size], parsed[variant]) for size in spec.sizes for variant in spec.variants}


def _values(overrides: List[str], owner: str) -> dict:
    out = {}
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ProtocolError(f"{owner}: {str(e).strip().splitlines()[0]}")
    for o in parsed:
        if o.is_sweep_override():
            raise ProtocolError(f"{owner}: {o.input_line!r} sweeps several values; a variant or size sets one")
        node = out
        *parents, leaf = o.key_or_group.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = o.value()
    return out


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _check_overlaps(spec: Spec) -> None:
    """A key set twice would be silently decided by precedence: the command line beats a cell's config."""
    keys = lambda overrides: {o.split("=", 1)[0].lstrip("+") for o in overrides}
    everywhere = keys(spec.train_overrides)
    for kind, owners in (("variant", spec.variants), ("size", spec.sizes)):
        for name, overrides in owners.items():
            both = keys(overrides) & everywhere
            if both:
                raise ProtocolError(f"{kind} {name} sets {', '.join(sorted(both))}, which the command line also sets "
                                    "for every run (and would win); drop one of them")
    for size, size_overrides in spec.sizes.items():
        for variant, variant_overrides in spec.variants.items():
            both = keys(size_overrides) & keys(variant_overrides)
            if both:
                raise ProtocolError(f"size {size} and variant {variant} both set {', '.join(sorted(both))}")
