"""The protocol's cells as train.py configs: each composed and built (meta device) before anything trains, then run by
lab/launcher.py as generated Hydra options (`+job=<name>`), one `train.py -m` multirun per stage."""

import copy
import dataclasses
import hashlib
import json
from typing import Callable, Dict, List, Optional, Tuple

import torch

from lab.ablation.protocol import Cell, ProtocolError, Spec
from lab.sweep import Budget
from model import Transformer

REGISTRATION_TAG = "registration="  # a cell's logger tag: the first 12 hex digits of its pre-registration's SHA-256

Compose = Callable[[List[str]], object]  # overrides → the TrainConfig train.py would run
ParseOverrides = Callable[[List[str]], List[Tuple[str, object]]]  # overrides → (dotted key, value)


def config_digest(cfg) -> str:
    """SHA-256 of what a composed TrainConfig computes: every preset's and config group's content, without where the
    run is written (outputs_dir, run_name, data.cache_dir) or how it is logged."""
    data = dataclasses.asdict(cfg)
    for key in ("outputs_dir", "run_name", "logger"):
        data.pop(key)
    data["data"].pop("cache_dir")
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def validate(
    spec: Spec, compose: Compose, configs: Optional[dict] = None
) -> Tuple[Dict[str, Dict[str, dict]], Dict[str, Budget]]:
    """({size: {variant: parameter counts}}, {size: the reference's workload}); a cell that would not
    compose or build is a ProtocolError naming it. `configs` gets each "size/variant"'s config_digest."""
    check_overlaps(spec)
    models, budgets = {}, {}
    for size, size_overrides in spec.sizes.items():
        models[size] = {}
        for variant in spec.variants_at(size):
            variant_overrides, lr = spec.variants[variant], spec.lr_grid[0]
            overrides = spec.overrides(
                *size_overrides, *variant_overrides, f"optim.lr={lr}", f"optim.min_lr={lr * spec.min_lr_ratio}"
            )
            try:
                cfg = compose(overrides)
                with torch.device("meta"):  # shapes only: no memory, instant
                    counts = Transformer(cfg.model).param_counts()
            except (ValueError, TypeError) as e:
                raise ProtocolError(
                    f"size {size}, variant {variant} does not compose ({' '.join(overrides)}): "
                    f"{str(e).strip().splitlines()[0]}"
                )
            if configs is not None:
                configs[f"{size}/{variant}"] = config_digest(cfg)
            models[size][variant] = {
                "total": counts["total"],
                "mlp": counts["mlp"],
                "intermediate_size": cfg.model.resolved_intermediate_size,
            }
            if variant == spec.reference:
                budgets[size] = budget_of(cfg)
    return models, budgets


def apply_transfer(spec: Spec, compose: Compose) -> None:
    """Under transfer_from, every cell trains under μP with the transfer size's width as the base (unless
    the command line names a parametrization or base of its own), and the sizes must be a width ladder:
    μP keeps the best LR across width, not across depth."""
    if not spec.transfer_from:
        return
    try:
        models = {size: compose(spec.overrides(*overrides)).model for size, overrides in spec.sizes.items()}
    except (ValueError, TypeError) as e:
        raise ProtocolError(f"transfer_from: a size does not compose: {str(e).strip().splitlines()[0]}")
    depths = ", ".join(f"{size}={m.n_layers}" for size, m in models.items())
    if len({m.n_layers for m in models.values()}) > 1:
        raise ProtocolError(
            f"transfer_from: the sizes differ in depth (n_layers {depths}); μP transfers the LR "
            "across width only: make the sizes a width ladder, e.g. --sizes "
            "'model.hidden_size=96,192,384', or drop transfer_from"
        )
    given = {o.split("=", 1)[0].lstrip("+") for o in spec.train_overrides}
    added = {"model.parametrization": "mup", "model.mup_base_width": models[spec.transfer_from].hidden_size}
    spec.train_overrides = [*spec.train_overrides, *(f"{k}={v}" for k, v in added.items() if k not in given)]


def budget_of(cfg) -> Budget:
    t = cfg.trainer
    if not t.max_steps or t.max_epochs or t.time_budget:
        raise ProtocolError(
            "the protocol's cells need a fixed step count, so that every cell trains the same steps: "
            "set trainer.max_steps (with trainer.max_epochs=null and trainer.time_budget=null) in its "
            "experiment or train_overrides"
        )
    return Budget.of(cfg)


def cell_values(spec: Spec, parse: ParseOverrides) -> Dict[Tuple[str, str], dict]:
    """{(size, variant): nested config values} for the cells' generated configs, the overrides read by
    `parse` (Hydra's own grammar: model.qk_norm=true → True, 1e-3 → 0.001) so they mean what they would
    mean on the command line."""
    parsed = {
        name: _values(overrides, name, parse) for name, overrides in [*spec.sizes.items(), *spec.variants.items()]
    }
    return {(size, variant): _merge(parsed[size], parsed[variant]) for size in spec.sizes for variant in spec.variants}


def _values(overrides: List[str], owner: str, parse: ParseOverrides) -> dict:
    out = {}
    try:
        parsed = parse(list(overrides))
    except ValueError as e:
        raise ProtocolError(f"{owner}: {e}")
    for key, value in parsed:
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def check_overlaps(spec: Spec) -> None:
    """A key set twice would be silently decided by precedence: the command line beats a cell's config."""
    keys = lambda overrides: {o.split("=", 1)[0].lstrip("+") for o in overrides}
    everywhere = keys(spec.train_overrides)
    for kind, owners in (("variant", spec.variants), ("size", spec.sizes)):
        for name, overrides in owners.items():
            both = keys(overrides) & everywhere
            if both:
                raise ProtocolError(
                    f"{kind} {name} sets {', '.join(sorted(both))}, which the command line also sets "
                    "for every run (and would win); drop one of them"
                )
    for size, size_overrides in spec.sizes.items():
        for variant, variant_overrides in spec.variants.items():
            both = keys(size_overrides) & keys(variant_overrides)
            if both:
                raise ProtocolError(f"size {size} and variant {variant} both set {', '.join(sorted(both))}")


def cell_config(
    cell: Cell, values: dict, min_lr_ratio: float, group: str, stage: str, registration: Optional[str] = None
) -> dict:
    """The cell's config, merged after every other group: the variant's and size's values, its
    LR (min_lr scaled along), seed, run name (= its directory) and wandb group and tags — among them the
    pre-registration it runs under, so every run directory's config.yaml names it too."""
    config = copy.deepcopy(values)
    config.setdefault("optim", {}).update(lr=cell.lr, min_lr=cell.lr * min_lr_ratio)
    config.update(seed=cell.seed, run_name=cell.run_name)
    config["logger"] = {
        **config.get("logger", {}),
        "group": group,
        "tags": ["ablate", stage, f"variant={cell.variant}", f"size={cell.size}", f"lr={cell.lr:g}"]
        + ([f"{REGISTRATION_TAG}{registration[:12]}"] if registration else []),
    }
    return config
