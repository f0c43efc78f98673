"""manifest.json: every file of a checkpoint with its size and SHA-256, written last at save time and checked
at every load, so bit rot, a truncated copy or an edited file is refused in one line naming the file.

safetensors and torch.save keep no checksum: 64 flipped bytes inside a tensor load fine and train,
evaluate and generate on, wrong. SHA-256 runs at ~1.3 GB/s on one core here (BENCHMARKS.md, checkpoint
verification): about a second per GB, the cost of reading the checkpoint once more. Checkpoints written
before manifests existed load with a warning that they cannot be verified; one whose state.json shows a
version that writes manifests is refused without its manifest (it was deleted, maybe with the files it
vouched for edited). A file the manifest does not list is refused too (an added special_tokens.json would
change generation): only documentation (*.md, *.txt) and hidden files may sit beside the listed ones.

The manifest also carries the checkpoint format's version (`minillama-checkpoint/N`): a checkpoint of a later
format than this code knows is refused by every loader, verified or not, with "update minillama", never
misread and never called damaged. docs/architecture.md's recipe "Change the checkpoint format" says when N goes up.
"""
import hashlib
import json
from pathlib import Path
from typing import Callable, Optional

from training.checkpoint.errors import CheckpointError
from training.checkpoint.run_state import read_state

MANIFEST = "manifest.json"
# The checkpoint format's version. It goes up with any change an older minillama would misread (a renamed file,
# weight or state.json field, another meaning for one); this code reads every version up to it, and a checkpoint
# without a manifest (written before them) is version 1. tests/test_checkpoint_format.py holds a checkpoint of each
# version, and fails when what the writer writes no longer matches the current version's.
FORMAT_VERSION = 1
FORMAT_PREFIX = "minillama-checkpoint/"
FORMAT = f"{FORMAT_PREFIX}{FORMAT_VERSION}"
CHUNK = 1 << 24  # 16 MiB reads: the hash, not the syscalls, sets the pace
NEVER_READ = (".md", ".txt")  # a model card or a note beside the files: no loader reads them
# state.json fields that only versions writing manifests wrote: "manifest" (written since issue 38), and
# "evals_since_best", which came with early stopping, after manifests.
MANIFEST_ERA_FIELDS = ("manifest", "evals_since_best")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(ckpt: Path) -> None:
    """manifest.json for every file in `ckpt` (the checkpoint's last file: it vouches for all the others)."""
    files = sorted(p for p in Path(ckpt).iterdir() if p.is_file() and p.name != MANIFEST)
    entries = {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in files}
    (Path(ckpt) / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": entries}, indent=2) + "\n")


def read_manifest(ckpt: Path) -> Optional[dict]:
    """{file name: {"bytes", "sha256"}}, or None for a checkpoint written before manifests."""
    path = Path(ckpt) / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if _version(manifest) is None or not isinstance(files, dict):
            raise ValueError("not a minillama manifest")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} is unreadable ({e}); the checkpoint is damaged: use another one, or "
                              "--no-verify / verify_checkpoint=false to load it unchecked") from None
    refuse_newer_format(ckpt, _version(manifest))
    return files


def format_version(ckpt: Path) -> Optional[int]:
    """The checkpoint format `ckpt` was written in: its manifest's, 1 without a manifest (written before them),
    None when the manifest is unreadable (verification then names the damage)."""
    path = Path(ckpt) / MANIFEST
    if not path.exists():
        return 1
    try:
        return _version(json.loads(path.read_text()))
    except (OSError, ValueError, AttributeError):
        return None


def refuse_newer_format(ckpt: Path, version: Optional[int]) -> None:
    """Raise CheckpointError for a checkpoint of a format later than this code reads: its files may mean what this
    version cannot know (a renamed weight, a new state.json field), so it is refused before anything reads them."""
    if version is not None and version > FORMAT_VERSION:
        reads = "format 1" if FORMAT_VERSION == 1 else f"formats 1 to {FORMAT_VERSION}"
        raise CheckpointError(f"checkpoint {ckpt} is in checkpoint format {version}, written by a newer minillama; "
                              f"this one reads {reads}: update minillama (git pull, then make setup) to load it")


def _version(manifest: dict) -> Optional[int]:
    """N for a manifest whose "format" is minillama-checkpoint/N (N ≥ 1), else None."""
    tag = manifest.get("format")
    number = tag[len(FORMAT_PREFIX):] if isinstance(tag, str) and tag.startswith(FORMAT_PREFIX) else ""
    return int(number) if number.isdigit() and int(number) >= 1 else None


def damage(ckpt: Path) -> Optional[str]:
    """What is wrong with `ckpt`'s files against its manifest (the first problem), or None if they match.
    A checkpoint without a manifest (written before them) has nothing to check against: None."""
    files = read_manifest(ckpt)
    if files is None:
        return None
    unlisted = sorted(p.name for p in Path(ckpt).iterdir() if p.is_file() and p.name != MANIFEST
                      and p.name not in files and not p.name.startswith(".") and p.suffix not in NEVER_READ)
    if unlisted:
        return (f"{unlisted[0]} is not in the manifest (added after the checkpoint was written"
                + (f"; {len(unlisted) - 1} more unlisted" if len(unlisted) > 1 else "") + "), and a loader would read it")
    for name, entry in files.items():
        path = Path(ckpt) / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != entry["bytes"]:
            return f"{name} has {path.stat().st_size:,} bytes, the manifest says {entry['bytes']:,} (truncated, corrupt or replaced)"
        if file_sha256(path) != entry["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (bit rot, or the file was edited)"
    return None


def verify(ckpt: Path, warn: Callable[[str], None] = lambda message: None,
           unverifiable: str = "written by an older minillama") -> None:
    """Raise CheckpointError naming the damaged (or unlisted) file; for a directory that has no manifest, raise
    if its state.json shows it was written with one, else warn once (`unverifiable` says why it may have none)."""
    if read_manifest(ckpt) is None:
        if _written_with_manifest(ckpt):
            raise CheckpointError(f"checkpoint {ckpt} has no {MANIFEST}, but its state.json was written by a minillama "
                                  "that writes one: it was deleted, so nothing vouches for the other files; restore "
                                  "it, use another checkpoint, or --no-verify / verify_checkpoint=false to load it "
                                  "unchecked")
        warn(f"warning: {ckpt} has no {MANIFEST} ({unverifiable}): its files cannot be verified")
        return
    problem = damage(ckpt)
    if problem is not None:
        raise CheckpointError(f"checkpoint {ckpt} is damaged: {problem}; use another checkpoint (an earlier step, "
                              "or checkpoints/best), or --no-verify / verify_checkpoint=false to load it anyway")


def _written_with_manifest(ckpt: Path) -> bool:
    try:
        fields = read_state(ckpt)
    except (OSError, ValueError):  # no state.json (a Hugging Face directory), or unreadable: nothing shows it
        return False
    return isinstance(fields, dict) and any(field in fields for field in MANIFEST_ERA_FIELDS)
