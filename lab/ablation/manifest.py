"""The protocol manifest, protocol.yaml in the protocol directory: the spec it runs (variants, grid,
seeds, sizes, overrides, the pre-registered contrasts), the models' sizes, the timing and power estimate,
the chosen LRs and every cell's state — rewritten atomically as the protocol advances, and the spec a
resume continues with."""

import os
import time
from pathlib import Path
from typing import Optional

import yaml

from analysis.runs import NOT_A_VARIANT
from lab.ablation.protocol import ProtocolError, Spec

MANIFEST = "protocol.yaml"
FORMAT = 2  # 2: pre-registered contrasts, LR seed apart from the measuring seeds, LR extensions


def load(protocol_dir: Path) -> Optional[dict]:
    path = protocol_dir / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ProtocolError(f"cannot read {path} ({type(e).__name__}); restore it or start a new --dir")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "spec" not in manifest:
        raise ProtocolError(f"{path} is not a protocol manifest of this version; start a new --dir")
    return manifest


def save(protocol_dir: Path, manifest: dict) -> None:
    """Write-then-rename: a Ctrl-C or a full disk never leaves half a manifest."""
    manifest = {"format": FORMAT, **manifest, "updated": time.strftime("%Y-%m-%d %H:%M:%S")}
    path = protocol_dir / MANIFEST
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True))
    os.replace(tmp, path)


def spec_of(manifest: dict) -> Spec:
    return Spec(**manifest["spec"])


def identity(overrides) -> list:
    """The overrides that change what is trained: paths, threads, logging and early stops do not."""

    def changes_training(o: str) -> bool:
        key = o.split("=", 1)[0].lstrip("+")
        return not any(key == n or (n.endswith(".") and key.startswith(n)) for n in NOT_A_VARIANT)

    return sorted(o for o in overrides if changes_training(o))


def check_continuable(stored: Spec, new: Spec, manifest_path: Path) -> None:
    """A resume may add variants, sizes, LRs or seeds (new cells), but must not change what an
    existing name means: finished cells would silently mix two setups."""
    where = f"{manifest_path} was started with"
    if stored.experiment != new.experiment:
        raise ProtocolError(f"{where} experiment={stored.experiment}, not {new.experiment}; use a new --dir")
    if identity(stored.train_overrides) != identity(new.train_overrides):
        raise ProtocolError(
            f"{where} train.py overrides {' '.join(identity(stored.train_overrides)) or '(none)'}, "
            f"not {' '.join(identity(new.train_overrides)) or '(none)'}; pass the same ones, or none "
            "to reuse them, or use a new --dir"
        )
    for name in (
        "reference",
        "min_lr_ratio",
        "stage1_seed",
        "lr_extensions",
        "lr_tie_tolerance",
        "alpha",
        "multitest",
        "equivalence_margin",
        "transfer_from",
    ):
        if getattr(stored, name) != getattr(new, name):
            raise ProtocolError(
                f"{where} {name}={getattr(stored, name)}, not {getattr(new, name)}; the LR choice and "
                "the pre-registered analysis are fixed once runs exist: use a new --dir"
            )
    dropped = [v for v in stored.primary if v not in new.primary] + [v for v in new.primary if v not in stored.primary]
    if dropped:
        raise ProtocolError(
            f"{where} primary contrasts {', '.join(stored.primary) or '(none)'}, not "
            f"{', '.join(new.primary) or '(none)'}: a pre-registered family never changes after a "
            "look; use a new --dir"
        )
    moved = [
        v for v in stored.variants if v in new.variants and stored.variant_sizes.get(v) != new.variant_sizes.get(v)
    ]
    if moved:
        raise ProtocolError(
            f"{where} {', '.join(moved)} at other sizes (variant_sizes); where a variant runs is fixed "
            "with its family: use a new --dir"
        )
    left = [v for v in stored.secondary if v not in new.secondary]
    if left:
        raise ProtocolError(
            f"{where} {', '.join(left)} among the secondary contrasts; a new variant may join that "
            "family (which only makes its adjustment stricter), none may leave it; use a new --dir"
        )
    for kind, old, now in (("variant", stored.variants, new.variants), ("size", stored.sizes, new.sizes)):
        for name in old.keys() & now.keys():
            if sorted(old[name]) != sorted(now[name]):
                raise ProtocolError(
                    f"{where} {kind} {name} = {' '.join(old[name]) or '(preset)'}, not "
                    f"{' '.join(now[name]) or '(preset)'}; give the new one another name"
                )
