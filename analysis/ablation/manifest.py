"""The protocol manifest, protocol.yaml in the protocol directory: the spec it runs (variants, grid,
seeds, sizes, overrides), the models' sizes, the timing estimate, the chosen LRs and every cell's
state — rewritten atomically as the protocol advances, and the spec a resume continues with."""
import os
import time
from pathlib import Path
from typing import Optional

import yaml

from analysis.ablation.protocol import ProtocolError, Spec
from analysis.runs import NOT_A_VARIANT

MANIFEST = "protocol.yaml"
FORMAT = 1


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
        raise ProtocolError(f"{where} train.py overrides {' '.join(identity(stored.train_overrides)) or '(none)'}, "
                            f"not {' '.join(identity(new.train_overrides)) or '(none)'}; pass the same ones, or none "
                            "to reuse them, or use a new --dir")
    if stored.min_lr_ratio != new.min_lr_ratio:
        raise ProtocolError(f"{where} min_lr_ratio={stored.min_lr_ratio}, not {new.min_lr_ratio}; use a new --dir")
    for kind, old, now in (("variant", stored.variants, new.variants), ("size", stored.sizes, new.sizes)):
        for name in old.keys() & now.keys():
            if sorted(old[name]) != sorted(now[name]):
                raise ProtocolError(f"{where} {kind} {name} = {' '.join(old[name]) or '(preset)'}, not "
                                    f"{' '.join(now[name]) or '(preset)'}; give the new one another name")
