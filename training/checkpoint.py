"""The checkpoint, all of it: a run directory's files, the resumable state (state.json), saving atomically, the
manifest every load checks, the format version, `latest`/`best`, resume and init_from, the run directory's claim, and
the Checkpointer.

    <run>/config.yaml, metrics.jsonl, job_status.yaml, .owner (the live run's claim)
    <run>/checkpoints/step_N/ and checkpoints/best/step_N/, each holding
      model.safetensors  unwrapped weights (no _orig_mod./module. prefixes; a tied head stored once)
      model_config.json  the ModelConfig;  tokenizer.json (special_tokens.json beside it when not ours)
      config.yaml        the resolved training config;  optimizer.pt, rng.pt  (torch.load(weights_only=True))
      state.json         the RunState, field for field; its presence marks the directory complete
      manifest.json      the format and every other file's size and SHA-256, written last, checked by every load

Saves go to step_N.tmp and are renamed: a kill never leaves a half checkpoint that looks whole. Every file is
serialized in memory and written by one function, so a refused write keeps its errno. Nothing is ever unpickled as
arbitrary objects. A checkpoint is self-contained: copied or moved anywhere, it loads and resumes.
"""

import dataclasses
import errno
import fcntl
import hashlib
import io
import json
import math
import os
import pickle
import re
import resource
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed.checkpoint.state_dict as dcp  # unsharded state dicts keyed by name, at any world size
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as save_safetensors
from tokenizers import Tokenizer

from data.cache import open_intact
from data.tokenizer import SPECIAL_TOKENS_FILE, file_hash
from model import ModelConfig, Transformer
from training import distributed as D
from training import one_line
from training.budget import clock
from training.optim import UNPLANNED_END, lr_at

CONFIG, METRICS, JOB_STATUS, CLAIM = "config.yaml", "metrics.jsonl", "job_status.yaml", ".owner"
CHECKPOINTS = "checkpoints"
WEIGHTS, MODEL_CONFIG, TOKENIZER = "model.safetensors", "model_config.json", "tokenizer.json"
OPTIMIZER, RNG, STATE, MANIFEST = "optimizer.pt", "rng.pt", "state.json", "manifest.json"
BEST, TIED_KEY, ABANDONED = "best", "lm_head.weight", "abandoned-"
# Up with any change an older minillama would misread (a renamed file, weight or state.json field). Before a release,
# an older format is not kept beside the new one: it is refused, naming the last commit that reads it.
FORMAT_VERSION, FORMAT_PREFIX = 2, "minillama-checkpoint/"
LAST_READER = {1: "739fe5d"}  # format → the last commit of minillama that reads it
NEVER_READ = (".md", ".txt")  # notes beside the files, which no loader reads
RESUMABLE_CHANGES = ("dropout", "init_std", "max_seq_len")  # model fields a resume may change: they shape no weight


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete, corrupt or does not fit: one `error:` line."""


class CheckpointWriteError(CheckpointError):
    """A refused write (full disk, file-size limit, permissions): nothing was kept or pruned."""


class NonFiniteCheckpoint(CheckpointError):
    """NaN/inf weights or optimizer state: nothing written."""


@dataclass(frozen=True)
class RunFiles:
    """One run directory's files."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    config = property(lambda self: self.root / CONFIG)
    metrics = property(lambda self: self.root / METRICS)
    job_status = property(lambda self: self.root / JOB_STATUS)
    claim = property(lambda self: self.root / CLAIM)
    checkpoints = property(lambda self: self.root / CHECKPOINTS)

    def holds_run(self) -> bool:
        return self.metrics.exists() or self.checkpoints.exists()

    def read_config(self) -> dict:
        """config.yaml. OSError for a missing file, yaml.YAMLError for a corrupt one."""
        return yaml.safe_load(self.config.read_text()) or {}


# ---- the resumable state ----------------------------------------------------------------------------------------


@dataclass
class RunState:
    """Where a run stands; state.json holds its fields as they are. The loop advances step and tokens_seen itself."""

    step: int = 0  # optimizer steps done
    tokens_seen: int = 0
    elapsed_before: float = 0.0  # training seconds before this process (state.json: up to its save)
    skipped_steps: int = 0  # non-finite steps whose update was skipped
    best_val_bpb: Optional[float] = None
    best_step: Optional[int] = None
    seed: int = 0  # with `step`, where the data order continues (data/loader.py)
    sampling: str = "random"  # data.sampling: which order that is; a resume keeps it
    world_size: int = 1
    max_steps: int = 0  # where the schedule ends: max_steps / max_epochs, or what a time budget planned
    stop_at: Optional[int] = None  # trainer.stop_at_step: stop there, as if interrupted
    budget_minutes: Optional[float] = None
    # A time budget's plans: at_step, max_steps, next_at, step_s, spent_s; the first, at step 0, is the end of
    # trainer.max_epochs / max_steps when set ("limit" names it): the clock's plans never go past it.
    plans: list = field(default_factory=list)
    evals_since_best: int = 0  # evaluations in a row without a lower best_val_bpb (trainer.early_stopping)
    stopped_early: bool = False
    precision: str = ""  # bf16 | fp32: what this process trains in
    machine: str = ""  # torch and the kernels' target (distributed.compute_identity): where bitwise holds
    data: dict = field(default_factory=dict)  # what the run trains on: the token cache and its digests (data_identity)
    data_changes: list = field(default_factory=list)  # resumes that went on with other data (resume_changed_data)
    started: float = field(default_factory=clock, metadata={"saved": False})  # this process's training clock

    @property
    def end(self) -> int:
        return min(self.max_steps, self.stop_at or self.max_steps)

    @property
    def budget_decided(self) -> bool:
        return self.budget_minutes is not None

    def plan_budget(
        self, minutes: float, max_steps: int, step_s: float, spent_s: float, next_at: int, limit: str = ""
    ) -> None:
        self.budget_minutes, self.max_steps = minutes, max_steps
        plan = {"at_step": self.step, "max_steps": max_steps, "next_at": next_at, "step_s": round(step_s, 6)}
        self.plans.append({**plan, "spent_s": round(spent_s, 3), **({"limit": limit} if limit else {})})

    def elapsed_s(self) -> float:
        """Training seconds over the whole run: earlier processes', then this one's."""
        return self.elapsed_before + clock() - self.started

    def improves_best(self, val_bpb: float) -> bool:
        """Record `val_bpb` if it is the lowest so far (a tie is not); whether it was."""
        if not math.isfinite(val_bpb) or (self.best_val_bpb is not None and val_bpb >= self.best_val_bpb):
            self.evals_since_best += 1
            return False
        self.best_val_bpb, self.best_step, self.evals_since_best = val_bpb, self.step, 0
        return True

    def to_json(self) -> dict:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("saved", True)}
        return {**fields, "elapsed_before": self.elapsed_s()}

    @classmethod
    def from_json(cls, fields: dict) -> "RunState":
        return cls(**fields)


def read_state(ckpt: Path) -> dict:
    """A checkpoint's state.json. OSError / ValueError for a missing or unreadable file."""
    return json.loads((Path(ckpt) / STATE).read_text())


def data_identity(meta: dict, directory: Path) -> dict:
    """What identifies a run's data: its token cache (the folder's name is its key) and the digests of its token
    files and tokenizer — equal digests are the same data, wherever the corpus now lies."""
    digests = {k: meta[k] for k in ("train_sha256", "val_sha256", "tokenizer_hash")}
    return {"cache": Path(directory).name, "tokens": meta["train_tokens"] + meta["val_tokens"], **digests}


# ---- finding checkpoints ----------------------------------------------------------------------------------------


def checkpoint_name(step: int) -> str:
    return f"step_{step:07d}"


def checkpoint_step(path: Path) -> Optional[int]:
    """N for a step_N directory, None for anything else (.tmp, .old, best, …)."""
    match = re.fullmatch(r"step_(\d+)", Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(root: Path) -> list:
    """Complete checkpoints under root, oldest first by number (step_10000000 after step_9999999)."""
    if not Path(root).is_dir():
        return []
    found = [p for p in Path(root).iterdir() if p.is_dir() and checkpoint_step(p) is not None and (p / STATE).exists()]
    return sorted(found, key=checkpoint_step)


def run_checkpoints(root: Path) -> list:
    """A run's complete step_N and best/step_N checkpoints, oldest first (a step held by both: the step_N one)."""
    steps = list_checkpoints(root)
    saved = {checkpoint_step(c) for c in steps}
    return sorted(
        steps + [c for c in list_checkpoints(Path(root) / BEST) if checkpoint_step(c) not in saved], key=checkpoint_step
    )


def last_good_checkpoint(root: Path) -> Optional[Path]:
    """The newest checkpoint (best/ included) whose files match their manifest, or None. It hashes them: called only
    where a message that names it is printed, never on a step's path. (Non-finite weights are never saved.)"""
    for ckpt in reversed(run_checkpoints(root)):
        try:
            if damage(ckpt) is None:
                return ckpt
        except CheckpointError:  # another format, or an unreadable manifest: not one to go back to
            continue
    return None


def nonfinite_tensors(tree, prefix: str = "") -> List[str]:
    """Names of the floating-point tensors in a nested state dict that hold NaN or inf."""
    if isinstance(tree, torch.Tensor):
        return [prefix] if tree.is_floating_point() and not bool(torch.isfinite(tree).all()) else []
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else []
    return [n for key, value in items for n in nonfinite_tensors(value, f"{prefix}.{key}" if prefix else str(key))]


def resolve_checkpoint(path: str, outputs_dir: str = "outputs") -> Path:
    """A checkpoint dir (wherever it lies, whatever its name); a run dir (its newest checkpoint, best/ included);
    `latest` (the newest checkpoint under outputs_dir) or `best` (the newest run's checkpoints/best)."""
    if path in ("latest", BEST):
        roots = Path(outputs_dir).glob(f"**/{CHECKPOINTS}" + ("/" + BEST if path == BEST else ""))
        candidates = [c for root in roots for c in run_checkpoints(root)]
        if not candidates:
            raise CheckpointError(
                f"'{path}' found no {'best ' if path == BEST else ''}checkpoint under {outputs_dir}/; "
                "train first or pass a checkpoint directory"
            )
        return max(candidates, key=lambda p: (p / STATE).stat().st_mtime)
    p = Path(path)
    if not p.exists():
        raise CheckpointError(
            f"{path} does not exist; pass a checkpoint directory, a run directory, 'latest' or 'best'"
        )
    if (p / MANIFEST).is_file() or (p / MODEL_CONFIG).is_file():  # a checkpoint itself
        return p
    found = run_checkpoints(p / CHECKPOINTS) or run_checkpoints(p)  # a run directory, or a folder of step_N
    if found:
        return found[-1]
    if (p / CHECKPOINTS).is_dir() or (p / CONFIG).is_file():
        raise CheckpointError(
            f"run directory {path} has no complete checkpoint (it stopped before its first checkpoint was written): "
            "start the run again"
        )
    raise CheckpointError(
        f"{path} is not a minillama checkpoint (no {MANIFEST}); pass a directory like "
        "outputs/<run>/checkpoints/step_0001000"
    )


def run_dir_of(ckpt: Path) -> Optional[Path]:
    """<run> of <run>/checkpoints/step_N or <run>/checkpoints/best/step_N; None for a checkpoint copied elsewhere."""
    ckpt = Path(ckpt).resolve()
    for folder in (ckpt.parent, ckpt.parent.parent):
        if folder.name == CHECKPOINTS and (folder.parent / CONFIG).is_file():
            return folder.parent
    return None


# ---- the manifest -------------------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_manifest(ckpt: Path) -> dict:
    """{file: {"bytes", "sha256"}}, once the format is this minillama's; an older or newer one, a missing or
    unreadable manifest, is a CheckpointError saying what reads it."""
    path = Path(ckpt) / MANIFEST
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {ckpt} has no {MANIFEST}: it was deleted (nothing vouches for the other files), or the "
            f"checkpoint predates manifests (format 1: `git checkout {LAST_READER[1]}` reads it); use another checkpoint"
        )
    try:
        manifest = json.loads(path.read_text())
        tag = manifest["format"]
        version = int(tag.removeprefix(FORMAT_PREFIX)) if tag.startswith(FORMAT_PREFIX) else None
        if version is None or not isinstance(manifest["files"], dict):
            raise ValueError("not a minillama manifest")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path} is unreadable ({e}); the checkpoint is damaged: use another one") from None
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {ckpt} is in checkpoint format {version}, written by a newer minillama; this one reads "
            f"format {FORMAT_VERSION}: update minillama (git pull, then make setup) to load it"
        )
    if version < FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {ckpt} is in checkpoint format {version}, which this minillama no longer reads; "
            f"`git checkout {LAST_READER[version]}` reads it (generate, evaluate or export it there), or train anew"
        )
    return manifest["files"]


def damage(ckpt: Path) -> Optional[str]:
    """The first problem of `ckpt`'s files against its manifest, or None. A file the manifest does not list counts
    too (an added special_tokens.json would change generation)."""
    files = read_manifest(ckpt)
    unlisted = sorted(
        p.name
        for p in Path(ckpt).iterdir()
        if p.is_file()
        and p.name != MANIFEST
        and p.name not in files
        and not p.name.startswith(".")
        and p.suffix not in NEVER_READ
    )
    if unlisted:
        more = f"; {len(unlisted) - 1} more unlisted" if len(unlisted) > 1 else ""
        return f"{unlisted[0]} is not in the manifest (added after the checkpoint was written{more}), and a loader would read it"
    for name, entry in files.items():
        path = Path(ckpt) / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != entry["bytes"]:
            size = path.stat().st_size
            return f"{name} has {size:,} bytes, the manifest says {entry['bytes']:,} (truncated, corrupt or replaced)"
        if file_sha256(path) != entry["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (bit rot, or the file was edited)"
    return None


def verify(ckpt: Path) -> None:
    """CheckpointError naming the damaged file: every file against its size and SHA-256 in the manifest."""
    if (problem := damage(ckpt)) is not None:
        raise CheckpointError(
            f"checkpoint {ckpt} is damaged: {problem}; use another checkpoint (an earlier step, or checkpoints/best), "
            "or --no-verify / verify_checkpoint=false to load it anyway"
        )


# ---- saving --------------------------------------------------------------------------------------------------------


def write_error_cause(error: OSError, path: Path, folder: Optional[Path] = None) -> str:
    """`<cause> while writing <path>; <what to do>`, from the errno of a refused write. The advice names `folder`."""
    code, limit = error.errno, resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    where, elsewhere = (
        Path(folder) if folder is not None else Path(path).parent,
        "write the run elsewhere (hydra.run.dir=…)",
    )
    cause, fix = {
        errno.ENOSPC: (
            "no space left on device",
            f"free space on the disk holding {where} (or lower trainer.keep_last)",
        ),
        errno.EFBIG: (
            f"the file-size limit (ulimit -f: {limit:,} bytes) was reached",
            "raise it (`ulimit -f unlimited`, or the job scheduler's file-size limit)",
        )
        if limit != resource.RLIM_INFINITY
        else ("file too large for the file system", f"write the run to another file system than {where}'s"),
        errno.EACCES: ("permission denied", f"make {where} writable for this user, or {elsewhere}"),
        errno.EPERM: ("permission denied", f"make {where} writable for this user, or {elsewhere}"),
        errno.EROFS: ("read-only file system", "write the run to a writable directory (hydra.run.dir=…)"),
        errno.EDQUOT: ("disk quota exceeded", "free space within your quota (or lower trainer.keep_last)"),
        errno.ENOENT: (
            f"{where} disappeared",
            "another process removed it: is a second run writing into this run directory?",
        ),
        errno.EIO: ("I/O error", "the disk may be failing: check it (dmesg) and write the run elsewhere"),
    }.get(code, ((os.strerror(code) if code else one_line(error, 200)).lower(), f"fix the disk or {elsewhere}"))
    return f"{cause} while writing {path}; {fix}"


def write_file(path: Path, data: bytes) -> None:
    """The one way a checkpoint's file reaches the disk: a refused write is an OSError with its errno (the libraries'
    own writers turn it into a message without one). Readable as any file this process writes."""
    with open(path, "wb") as f:
        f.write(data)


def serialize(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def tokenizer_files(tokenizer_path: Path) -> Dict[str, bytes]:
    """tokenizer.json, and an imported tokenizer's own BOS/EOS/PAD (special_tokens.json) beside it, as bytes."""
    special = Path(tokenizer_path).parent / SPECIAL_TOKENS_FILE
    return {
        TOKENIZER: Path(tokenizer_path).read_bytes(),
        **({SPECIAL_TOKENS_FILE: special.read_bytes()} if special.is_file() else {}),
    }


def manifest_bytes(entries: Dict[str, dict]) -> bytes:
    """manifest.json: the format and {file: {"bytes", "sha256"}}."""
    manifest = {"format": f"{FORMAT_PREFIX}{FORMAT_VERSION}", "files": entries}
    return (json.dumps(manifest, indent=2) + "\n").encode()


def write_manifest(folder: Path) -> None:
    """A manifest for files already on disk (an exported Hugging Face directory: import_hf.py checks it)."""
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and p.name != MANIFEST)
    entries = {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in files}
    write_file(Path(folder) / MANIFEST, manifest_bytes(entries))


def save_checkpoint(
    root: Path,
    step: int,
    model_state: dict,
    model_cfg: ModelConfig,
    tokenizer: Dict[str, bytes],
    state: dict,
    config_yaml: str = "",
    optimizer_state: Optional[dict] = None,
    keep_last: int = 3,
    rng_state: Optional[dict] = None,
) -> Path:
    """Every file serialized here, written into step_N.tmp, manifest.json last, then one rename; then prune to
    keep_last. `tokenizer`: tokenizer_files(…); `state`: RunState's to_json(); `rng_state`: every rank's generators
    (default: this process's). NonFiniteCheckpoint (nothing written) for NaN/inf; CheckpointWriteError (the .tmp
    removed, nothing pruned) when the disk refuses."""
    weights = {k: v.detach().contiguous().cpu() for k, v in model_state.items()}
    if model_cfg.tie_embeddings:
        weights.pop(TIED_KEY, None)  # the embedding's storage; safetensors refuses shared tensors
    bad_weights = nonfinite_tensors(weights)
    if bad := bad_weights or nonfinite_tensors(optimizer_state or {}, "optimizer"):
        what = (
            f"{len(bad_weights)} of {len(weights)} weight tensors hold" if bad_weights else "the optimizer state holds"
        )
        raise NonFiniteCheckpoint(f"refusing to save step {step}: {what} NaN or inf (first: {bad[0]})")
    files = {
        WEIGHTS: save_safetensors(weights, metadata={"format": "pt"}),
        MODEL_CONFIG: json.dumps(dataclasses.asdict(model_cfg), indent=2).encode(),
        **tokenizer,
        CONFIG: config_yaml.encode(),
        **({OPTIMIZER: serialize(optimizer_state)} if optimizer_state is not None else {}),
        RNG: serialize(rng_state or rng_states_of_this_process()),
        STATE: json.dumps(state, indent=2).encode(),
    }
    entries = {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    root, files = Path(root), {**files, MANIFEST: manifest_bytes(entries)}
    final = root / checkpoint_name(step)
    tmp = target = final.with_name(final.name + ".tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, data in files.items():
            target = tmp / name
            write_file(target, data)
        target = final
        if final.exists():  # a re-save: the old copy goes aside first, so a complete copy exists at every moment
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            try:
                os.replace(tmp, final)
            except OSError:
                os.replace(old, final)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except OSError as e:
        cause = write_error_cause(e, target, root)  # before freeing space
        shutil.rmtree(tmp, ignore_errors=True)
        previous = run_checkpoints(root)
        kept = f"the last checkpoint, {previous[-1]}, is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointWriteError(f"cannot save checkpoint {final.name}: {cause}; {kept}") from e
    older = [c for c in list_checkpoints(root) if checkpoint_step(c) < step]  # never the one just written
    for old in older[: max(len(older) - keep_last + 1, 0)] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def clean_partial_checkpoints(root: Path) -> List[Path]:
    """At start, before anything writes: remove the step_N.tmp a kill left mid-save (here and in best/), and put back
    a step_N.old whose re-save was killed between its two renames. Returns what was removed."""
    root, removed = Path(root), []
    if not root.is_dir():
        return []
    for folder in [root] + [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is None]:
        for leftover in sorted(folder.glob("step_*.old")):
            complete = leftover.with_suffix("")
            if (complete / STATE).exists():
                shutil.rmtree(leftover, ignore_errors=True)
                removed.append(leftover)
            else:
                shutil.rmtree(complete, ignore_errors=True)
                os.replace(leftover, complete)
        for leftover in sorted(folder.glob("step_*.tmp")):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(leftover)
    return removed


def move_aside_later_checkpoints(root: Path, step: int) -> List[Path]:
    """Resuming from an older checkpoint starts a new branch: its later steps (here and in best/) move into
    abandoned-<time>/, so `latest`, a run dir and keep_last never pick them. Nothing is deleted."""
    root = Path(root)
    if not root.is_dir():
        return []
    folders = [root] + [
        p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is None and not p.name.startswith(ABANDONED)
    ]
    later = [c for folder in folders for c in list_checkpoints(folder) if checkpoint_step(c) > step]
    if not later:
        return []
    for n in range(1, 1000):  # never share a folder with another call
        aside = root / f"{ABANDONED}{time.strftime('%Y%m%d-%H%M%S')}{'' if n == 1 else f'-{n}'}"
        try:
            aside.mkdir()
            break
        except FileExistsError:
            continue
    (aside / "README.txt").write_text(
        f"Checkpoints after {checkpoint_name(step)}, moved here when the run resumed "
        f"from {checkpoint_name(step)} on {time.strftime('%Y-%m-%d %H:%M:%S')}.\n"
    )
    moved = []
    for ckpt in later:
        target = aside / ckpt.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(ckpt, target)
        moved.append(target)
    return moved


# ---- loading -------------------------------------------------------------------------------------------------------


def load_model_config(ckpt: Path) -> ModelConfig:
    try:
        return ModelConfig(**json.loads((Path(ckpt) / MODEL_CONFIG).read_text()))
    except (OSError, json.JSONDecodeError, TypeError, ValueError, AttributeError) as e:  # [1]: not a dict at all
        raise CheckpointError(f"{ckpt}/{MODEL_CONFIG} is unreadable or invalid ({e}); the checkpoint is damaged")


def open_checkpoint(path: str, outputs_dir: str = "outputs", verify_files: bool = True) -> Tuple[Path, ModelConfig]:
    """(checkpoint, its model config) for a checkpoint, run dir, `latest` or `best`: its format read, its files checked
    against the manifest (unless off), its tokenizer's ids inside the model's vocabulary — what every loader does
    before it trusts anything; the weights are checked as they are read (read_weights)."""
    ckpt = resolve_checkpoint(path, outputs_dir)
    verify(ckpt) if verify_files else read_manifest(ckpt)  # unverified, a foreign format is still refused
    cfg = load_model_config(ckpt)
    try:
        vocab = Tokenizer.from_file(str(ckpt / TOKENIZER)).get_vocab(with_added_tokens=True)
    except Exception as e:  # tokenizers raises a bare Exception for unreadable files
        raise CheckpointError(f"{ckpt}/tokenizer.json is unreadable ({one_line(e, 200)}); use another checkpoint")
    if max(vocab.values(), default=-1) >= cfg.vocab_size:  # more rows than ids is fine; fewer is not
        raise CheckpointError(
            f"checkpoint {ckpt} contradicts itself: tokenizer.json has token ids up to {max(vocab.values())} but "
            f"model_config.json says vocab_size={cfg.vocab_size}; the files come from different runs: restore them, "
            "or use another checkpoint"
        )
    return ckpt, cfg


def read_weights(model: Transformer, ckpt: Path) -> dict:
    """model.safetensors as a full state dict for the unwrapped `model`, every key, shape and value checked."""
    try:
        weights = load_file(str(Path(ckpt) / WEIGHTS))
    except (OSError, SafetensorError, ValueError) as e:
        raise CheckpointError(f"{ckpt}/model.safetensors is corrupt or unreadable ({e}); use another checkpoint")
    expected = {k: v for k, v in model.state_dict().items() if not (k == TIED_KEY and model.cfg.tie_embeddings)}
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    wrong = [k for k in expected if k in weights and weights[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        cfg = model.cfg
        found = (
            f"{wrong[0]} has shape {tuple(weights[wrong[0]].shape)}, not {tuple(expected[wrong[0]].shape)}"
            if wrong
            else f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
        raise CheckpointError(
            f"checkpoint {ckpt} contradicts itself: model.safetensors does not hold what model_config.json "
            f"(hidden_size={cfg.hidden_size}, n_layers={cfg.n_layers}, vocab_size={cfg.vocab_size}) describes: "
            f"{found}; the files were edited or come from different runs: restore them, or use another checkpoint"
        )
    if bad := nonfinite_tensors(weights):  # never saved so: damaged, or written elsewhere
        raise CheckpointError(
            f"{ckpt}/model.safetensors holds NaN or inf in {bad[0]} ({len(bad)} of {len(weights)} tensors); use "
            "another checkpoint (an earlier step, or checkpoints/best)"
        )
    if model.cfg.tie_embeddings:
        weights[TIED_KEY] = weights["embed_tokens.weight"]
    return weights


def load_model(
    path: str, device="cpu", dtype: torch.dtype = torch.float32, verify: bool = True, outputs_dir: str = "outputs"
):
    """(Transformer in eval mode, tokenizer, checkpoint) for inference, checked first."""
    ckpt, cfg = open_checkpoint(path, outputs_dir, verify)
    model = Transformer(cfg)
    model.load_state_dict(read_weights(model, ckpt))
    return model.to(device=device, dtype=dtype).eval(), Tokenizer.from_file(str(ckpt / TOKENIZER)), ckpt


def safe_torch_load(path: Path):
    """torch.load(weights_only=True) in one line. A refused pickle gets its own message: torch's would suggest the
    unsafe loader, the one thing not to do with such a file."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        raise CheckpointError(
            f"{path} holds Python objects{f' ({found.group(1)})' if found else ''} that minillama never writes, so it "
            "was refused unread: the file was tampered with or comes from elsewhere; do not use this checkpoint, "
            "resume from another one"
        ) from None
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete, resume from another one") from None
    except Exception as e:  # RuntimeError, EOFError, … for truncated or corrupt archives
        raise CheckpointError(
            f"{path} is truncated or corrupt ({one_line(e, 200).split('. ')[0]}); resume from an older checkpoint"
        ) from None


def restore_rng(rng: dict, rank: int = 0, world_size: int = 1) -> bool:
    """This rank's generators back; False when the checkpoint has none for it (another world size)."""
    ranks = rng.get("ranks")
    if ranks is not None and len(ranks) == world_size:
        rng = ranks[rank]
    elif rank != 0 or ranks is not None:
        return False
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return True


def rng_states_of_this_process() -> dict:
    cuda = {"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}
    return {"torch": torch.get_rng_state(), **cuda}


# ---- full state dicts: the format at any world size ----------------------------------------------------------------


def _full(**options):
    """torch.distributed.checkpoint's unsharded state dicts, keyed by parameter name: what any world size loads."""
    return dcp.StateDictOptions(full_state_dict=True, **options)


def full_model_state(model: torch.nn.Module) -> dict:
    """The unsharded state dict of the unwrapped model (under torchrun, gathered: every rank calls it)."""
    return dcp.get_model_state_dict(model, options=_full(cpu_offload=True))


def full_optimizer_state(model: torch.nn.Module, optimizers: list) -> dict:
    """{"state": {name: ...}, "param_groups": [{..., "params": [names]}]}: several optimizers in one dict."""
    return dcp.get_optimizer_state_dict(model, optimizers, options=_full(cpu_offload=True))


def load_full_state(model: torch.nn.Module, optimizers, model_state: dict, optim_state) -> None:
    dcp.set_model_state_dict(model, model_state, options=_full(broadcast_from_rank0=False))
    if optimizers is not None and optim_state is not None:
        dcp.set_optimizer_state_dict(model, optimizers, optim_state, options=_full(broadcast_from_rank0=False))


# ---- resume and init_from: one open, two uses ----------------------------------------------------------------------


def architecture_changes(run_model: ModelConfig, ckpt_model: ModelConfig) -> List[str]:
    """`model.k=v (the checkpoint has k=w)` for each field of the run's model its weights would not fit
    (n_kv_heads=None equals n_kv_heads=n_heads: the resolved values are compared where a field has one)."""
    changed = []
    for name in (f.name for f in dataclasses.fields(ModelConfig)):
        mine, theirs, resolved = getattr(run_model, name), getattr(ckpt_model, name), f"resolved_{name}"
        same = mine == theirs or (
            hasattr(run_model, resolved) and getattr(run_model, resolved) == getattr(ckpt_model, resolved)
        )
        if not same and name not in RESUMABLE_CHANGES:
            changed.append(f"model.{name}={mine} (the checkpoint has {name}={theirs})")
    return changed


@dataclass(frozen=True)
class Opened:
    """A checkpoint opened and checked (open_checkpoint) before any data is prepared: a run continues from it (Resume)
    or starts from its weights (InitFrom)."""

    path: Path
    model: ModelConfig

    def check_fits(self, run_model: ModelConfig) -> None:
        """model.* overrides may not change the architecture: each change named, and what to do."""
        if changed := architecture_changes(run_model, self.model):
            raise CheckpointError(f"cannot {self.verb} {self.path} with {', '.join(changed)}: {self.fix}")


@dataclass(frozen=True)
class Resume(Opened):
    """A checkpoint a run continues from — its step, schedule, optimizer state, RNG, data and run directory."""

    fields: dict  # state.json
    verb, fix = "resume", "a resumed run keeps the checkpoint's architecture; drop those model.* overrides"

    @classmethod
    def open(cls, path: str, outputs_dir: str = "outputs", verify: bool = True) -> "Resume":
        ckpt, model = open_checkpoint(path, outputs_dir, verify)
        try:
            return cls(ckpt, model, read_state(ckpt))
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"{ckpt}/state.json is unreadable ({one_line(e, 200)}); resume from an older checkpoint"
            )

    step = property(lambda self: self.fields["step"])
    precision = property(lambda self: self.fields["precision"])
    run_dir = property(lambda self: run_dir_of(self.path))  # None for a checkpoint copied out of its run

    def cached_data(self, cache_dir: str):
        """The token cache the run trained on, if it is still in `cache_dir` and intact (the corpus may have moved)."""
        return open_intact(Path(cache_dir) / self.fields["data"]["cache"])

    def check_data(self, now: dict, go_on: bool) -> Optional[dict]:
        """Refuse other data than the run trained on (its digests, data_identity), naming what changed and the two
        ways on; with `go_on` (resume_changed_data=true) the change is returned, for state.json to record."""
        before = self.fields["data"]
        if all(now[k] == before[k] for k in ("train_sha256", "val_sha256", "tokenizer_hash")):
            return None
        what = "tokenizer" if now["tokenizer_hash"] != before["tokenizer_hash"] else "tokens"
        change = {"at_step": self.step, "before": before, "after": now}
        if go_on:
            return change
        raise CheckpointError(
            f"the data changed since {self.path}: its run trained on {before['tokens']:,} tokens (token cache "
            f"{before['cache']}), this corpus gives {now['tokens']:,} with other {what} (cache {now['cache']}); "
            f"restore the data it trained on, or start a new run from its weights: init_from={self.path} "
            "(resume_changed_data=true goes on with this data, recorded in state.json)"
        )

    def restore(
        self,
        raw_model: torch.nn.Module,
        optimizers: list,
        precision: str,
        cfg,
        max_steps: Optional[int],
        info: D.DistInfo,
        say,
        run_dir: Path,
    ) -> RunState:
        """Weights, optimizer state, RNG into the built run (`cfg` a TrainConfig); the RunState it continues with.
        `max_steps`: what this config's max_steps / max_epochs end at (a time budget's plans go on instead);
        `run_dir`: where the run writes (the checkpoint's own run, or a new one for a copied checkpoint)."""
        state, t = RunState.from_json(self.fields), cfg.trainer
        if state.sampling != cfg.data.sampling:  # before loading anything: a default that changed must not switch it
            raise ValueError(
                f"{self.path} drew its batches with data.sampling={state.sampling}, this run with "
                f"data.sampling={cfg.data.sampling}; resume with data.sampling={state.sampling}, or "
                f"start a new run from its weights: init_from={self.path}"
            )
        tokens_per_step = t.micro_batch_size * t.seq_len * t.grad_accum_steps * info.world_size
        if state.sampling == "epochs" and state.tokens_seen != state.step * tokens_per_step:
            say(
                f"warning: this data.sampling=epochs run trained {state.tokens_seen:,} tokens in {state.step} steps, "
                f"not {state.step} × {tokens_per_step:,} (this resume's tokens per step): the epoch under way skips or "
                "repeats windows; keep trainer.micro_batch_size × grad_accum_steps × world size to continue its order "
                "exactly"
            )
        optim_state, rng = safe_torch_load(self.path / OPTIMIZER), safe_torch_load(self.path / RNG)
        load_full_state(raw_model, optimizers, read_weights(raw_model, self.path), optim_state)
        if not restore_rng(rng, info.rank, info.world_size):  # last: nothing after this may draw from it
            say("warning: the checkpoint holds no RNG state for this world size: dropout draws restart from the seed")
        state.precision, now = precision, D.compute_identity(info.device)
        if state.machine != now:
            say(
                f"warning: this run trained on {state.machine} up to step {state.step} and continues on {now}: "
                "it goes on, but is no longer bitwise what an uninterrupted run computes (other kernels round "
                "differently)"
            )
        state.machine = now
        if not (state.budget_decided and t.time_budget):  # a budget's plans go on; else the config's end
            state.max_steps, state.budget_minutes, state.plans = max_steps or UNPLANNED_END, None, []
        if state.stopped_early and t.early_stopping and state.evals_since_best >= t.early_stopping:
            raise ValueError(
                f"{self.path} ended its run early at step {state.step} (no lower validation bpb in "
                f"{state.evals_since_best} evaluations); to train on, resume with trainer.early_stopping=null or a "
                "larger patience"
            )
        state.stop_at, state.stopped_early = t.stop_at_step, False
        if state.step >= state.max_steps:
            what = (
                "the end its time budget planned"
                if state.budget_decided
                else f"trainer.max_steps={t.max_steps}"
                if t.max_steps == state.max_steps
                else f"the end trainer.max_epochs={t.max_epochs:g} sets ({state.max_steps} steps)"
            )
            raise ValueError(
                f"{self.path} is at step {state.step}, {'already at' if state.step == state.max_steps else 'past'} "
                f"{what}; pass a larger trainer.max_steps to train further (the schedule then stretches to it)"
            )
        before = self.fields["max_steps"]
        if before != state.max_steps and not state.budget_decided:
            old, new = lr_at(state.step, cfg.optim, before), lr_at(state.step, cfg.optim, state.max_steps)
            stretch = " (cosine's curve stretches to the new end; optim.schedule=wsd keeps its stable phase)"
            change = (
                f"stays {new:.3g}"
                if abs(new - old) <= 1e-12 + 1e-6 * old
                else f"goes from {old:.3g} to {new:.3g} at once" + (stretch if cfg.optim.schedule == "cosine" else "")
            )
            say(
                f"resume: the schedule now ends at step {state.max_steps}, not {before}; the learning rate at step "
                f"{state.step} {change}"
            )
        if info.is_main and run_dir == self.run_dir:  # a new branch of the same run: its later steps move aside
            if moved := move_aside_later_checkpoints(RunFiles(run_dir).checkpoints, state.step):
                say(f"resume: moved {len(moved)} later checkpoint(s) of the abandoned branch to {moved[0].parent}")
        if state.world_size != info.world_size:
            say(
                f"warning: resuming a {state.world_size}-process run on {info.world_size}: each step's global batch "
                "changes with the world size; adjust trainer.micro_batch_size to keep tokens per step"
            )
        state.seed, state.world_size = cfg.seed, info.world_size
        return state


@dataclass(frozen=True)
class InitFrom(Opened):
    """A checkpoint whose weights a NEW run starts from (step 0, its own data, optimizer, schedule and run directory):
    it takes only what the weights need, the architecture and the tokenizer."""

    source: str  # what the user named: a path, `latest`, `best`, or a Hugging Face directory
    verb, fix = (
        "start from",
        (
            "init_from keeps the checkpoint's architecture (its weights fit no other); drop those model.* overrides, "
            f"or train from scratch without init_from (model.* may change {', '.join(RESUMABLE_CHANGES)})"
        ),
    )

    @classmethod
    def open(cls, path: str, outputs_dir: str = "outputs", verify: bool = True, source: Optional[str] = None):
        if not Path(path).exists() and path not in ("latest", BEST):
            raise CheckpointError(
                f"init_from={path} does not exist; pass a checkpoint directory, a run directory, 'latest', 'best' "
                "or a Hugging Face Llama directory"
            )
        return cls(*open_checkpoint(path, outputs_dir, verify), source or path)

    def describe(self) -> str:
        step, where = checkpoint_step(self.path), str(self.path)
        where = f"{self.source} → {where}" if self.source != where else where
        return f"weights: from {where}" + (f" (its step {step})" if step else "") + "; a new run from step 0"

    def check_tokenizer(self, tokenizer_path: str) -> None:
        if file_hash(Path(tokenizer_path)) != file_hash(self.path / TOKENIZER):
            raise CheckpointError(
                f"data.tokenizer_path={tokenizer_path} is not the tokenizer of {self.path}: the weights read token ids "
                "of their own tokenizer, which init_from carries over; drop data.tokenizer_path (or train from "
                "scratch to use another tokenizer)"
            )

    def carry_tokenizer(self, cache_dir: str) -> Path:
        """The checkpoint's tokenizer (and special_tokens.json) copied to <cache_dir>/tokenizers/<hash>/, which
        outlives the checkpoint (keep_last may prune it; a staged import is temporary). Its tokenizer.json."""
        files = [p for p in (self.path / TOKENIZER, self.path / SPECIAL_TOKENS_FILE) if p.is_file()]
        key = hashlib.sha256("".join(file_hash(p) for p in files).encode()).hexdigest()[:16]
        folder = Path(cache_dir) / "tokenizers" / key
        if not (folder / TOKENIZER).is_file():
            tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")  # every torchrun rank carries it
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for file in files:
                shutil.copyfile(file, tmp / file.name)
            try:
                tmp.rename(folder)
            except OSError:  # another process carried the same bytes meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
        return folder / TOKENIZER

    def load(self, raw_model: torch.nn.Module) -> None:
        """Into the freshly built, not yet wrapped model: FSDP2 shards what it finds, DDP broadcasts it."""
        raw_model.load_state_dict(read_weights(raw_model, self.path))


# ---- the run directory: claimed atomically, so two runs never write into the same one -----------------------------


class RunDirBusy(ValueError):
    """The run directory is being trained in by a live process."""


class RunDirClaim:
    """The open, flock'ed claim file of the run directory this process owns (closing it drops the lock)."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self._fd = run_dir, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _owner(path: Path) -> Optional[dict]:
    try:
        owner = json.loads(path.read_text())
        return owner if isinstance(owner, dict) and {"pid", "host", "since"} <= owner.keys() else None
    except (OSError, ValueError):
        return None


def _write_owner(fd: int) -> None:
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)


def claim_new(run_dir: Path, max_tries: int = 1000) -> RunDirClaim:
    """Own `run_dir` if nobody does, else the first free <run_dir>-N: Hydra names directories after the second, and
    two runs started in it would share one. The claim is a file created with O_EXCL (atomic, NFSv3+), then flock'ed."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)  # Hydra made it already; another run may own it
    held = RunFiles(run_dir).holds_run()  # a run whose .owner is gone (deleted, or copied without dotfiles)
    for n in range(max_tries):
        candidate = run_dir if n == 0 else run_dir.with_name(f"{run_dir.name}-{n}")
        if n > 0:
            try:
                candidate.mkdir()  # exclusive: if it exists, someone else made it
            except FileExistsError:
                continue
        elif held:
            continue
        try:
            fd = os.open(candidate / CLAIM, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)  # nobody else can hold it: we just created the file
        _write_owner(fd)
        return RunDirClaim(candidate, fd)
    raise RunDirBusy(
        f"could not claim a run directory next to {run_dir} after {max_tries} tries; set hydra.run.dir to a fresh path"
    )


def claim_existing(run_dir: Path) -> RunDirClaim:
    """Take over a run directory to resume it; refused while a live process still trains in it."""
    path = Path(run_dir) / CLAIM
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _owner(path)
        os.close(fd)
        who = f"pid {owner['pid']} on {owner['host']} since {owner['since']}" if owner else "owner unknown"
        raise RunDirBusy(
            f"{run_dir} is in use by a live run ({who}); wait for it to stop, or resume another run directory"
        ) from None
    _write_owner(fd)
    return RunDirClaim(Path(run_dir), fd)


def claim_for_run(
    hydra_dir: Path, resume: Optional[Resume], info: D.DistInfo, say
) -> Tuple[Path, Optional[RunDirClaim]]:
    """(run directory, claim): rank 0 claims the resumed run's directory, or Hydra's (a sibling if another run owns
    it) — also for a resume whose checkpoint lies outside a run directory, or in one it cannot write; every rank takes
    rank 0's choice."""
    claim = None
    if info.is_main:
        if resume is not None and resume.run_dir is None:
            say(f"resume: {resume.path} is not inside a run directory; the run goes on in a new one, {hydra_dir}")
        elif resume is not None:
            try:
                claim = claim_existing(resume.run_dir)
            except OSError as e:  # a read-only copy of a run: go on beside it, never lose the resume
                say(
                    f"resume: cannot write into {resume.run_dir} ({write_error_cause(e, resume.run_dir / CLAIM).split(' while')[0]}); the run goes on in a new directory, {hydra_dir}"
                )
        if claim is None:
            claim = claim_new(hydra_dir)
            if claim.run_dir != hydra_dir:
                say(
                    f"run dir {hydra_dir} belongs to another run (started the same second, or named twice): using {claim.run_dir}"
                )
    run_dir = D.broadcast_object(claim.run_dir if claim else None, info)
    if run_dir != hydra_dir:
        discard_if_unused(hydra_dir)  # Hydra made a directory this run does not use
    return run_dir, claim


def discard_if_unused(path: Path, failed_start: bool = False) -> None:
    """Remove a run directory that holds only this process's claim and empty logs — after a failed start also its
    config.yaml and logs — and its date folder if left empty. Another run's claim, checkpoints or metrics keep it."""
    path, claim = Path(path), Path(path) / CLAIM
    owner = _owner(claim)
    if not path.is_dir() or (
        claim.exists() and not (owner and owner["pid"] == os.getpid() and owner["host"] == socket.gethostname())
    ):
        return

    disposable = (
        (lambda p: p.suffix == ".log" or p.name == CONFIG)
        if failed_start
        else (lambda p: p.suffix == ".log" and not p.stat().st_size)
    )
    try:  # another rank of a resume may discard the same Hydra directory first
        entries = list(path.iterdir())
        if any(p.is_dir() or (p.name != CLAIM and not disposable(p)) for p in entries):
            return
    except FileNotFoundError:
        return
    for p in entries:
        p.unlink(missing_ok=True)
    try:
        path.rmdir()
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", path.parent.name) and not any(path.parent.iterdir()):
            path.parent.rmdir()  # outputs/<date>/ that held only this directory
    except OSError:  # something appeared meanwhile: keep it
        pass


# ---- the loop's checkpointer ---------------------------------------------------------------------------------------


class Checkpointer:
    """checkpoints/step_N and checkpoints/best/step_N, every rank taking part (FSDP gathers), rank 0 writing and every
    rank learning the outcome: a failed write on rank 0 stops all ranks, never leaves one in the next collective. The
    tokenizer is read once, at the start: a data cache deleted mid-run costs no checkpoint."""

    def __init__(
        self,
        run_dir: Path,
        raw_model,
        optimizers: list,
        tokenizer_path: Path,
        model_cfg: ModelConfig,
        config_yaml: str,
        keep_last: int,
        info: D.DistInfo,
        state: RunState,
        say=lambda text: None,
    ):
        self.root, self.raw_model, self.optimizers, self.model_cfg = (
            RunFiles(run_dir).checkpoints,
            raw_model,
            optimizers,
            model_cfg,
        )
        self.config_yaml, self.keep_last, self.info, self.state, self.say = config_yaml, keep_last, info, state, say
        self.tokenizer_path, self.tokenizer = Path(tokenizer_path), tokenizer_files(tokenizer_path)
        self.cache_gone = False
        self.saved_step: Optional[int] = None  # the step of the last step_N this process wrote
        self.last_path: Optional[Path] = None

    def save(self) -> Path:
        self.last_path, self.saved_step = self._write(self.root, self.keep_last), self.state.step
        return self.last_path

    def save_best(self) -> Path:
        """The new best is renamed into place before the old one is pruned: a best exists at every moment."""
        return self._write(self.root / BEST, keep_last=1)

    def time_one(self) -> float:
        """Seconds one checkpoint takes, written where nothing looks (a time budget's probe)."""
        probe, start = self.root / ".budget-probe", time.time()
        try:
            self._write(probe, keep_last=0)
            return time.time() - start
        finally:
            if self.info.is_main:
                shutil.rmtree(probe, ignore_errors=True)

    def last_good(self) -> Optional[Path]:
        return last_good_checkpoint(self.root)

    def _write(self, root: Path, keep_last: int) -> Path:
        info, state = self.info, self.state
        local = [p.detach().to_local() if hasattr(p, "to_local") else p.detach() for p in self.raw_model.parameters()]
        (bad,) = D.agree_max([int(not all(bool(torch.isfinite(p).all()) for p in local))], info)  # a sync on a GPU
        if bad:  # a NaN checkpoint is worse than none: a resume would start from it
            last = self.last_good()
            raise NonFiniteCheckpoint(
                f"the weights at step {state.step} are not finite; no checkpoint written. "
                + (f"The last good checkpoint is {last}" if last else "There is no earlier checkpoint")
                + " — lower optim.lr, raise optim.warmup_steps or check the data"
            )
        model_state = full_model_state(self.raw_model)  # collectives under FSDP: every rank calls these
        optim_state = full_optimizer_state(self.raw_model, self.optimizers)
        ranks = D.gather_objects(rng_states_of_this_process(), info)  # each rank's dropout draws its own
        path, error = None, None
        if info.is_main:
            if not self.cache_gone and not self.tokenizer_path.exists():
                self.cache_gone = True
                self.say(
                    f"warning: the data cache {self.tokenizer_path.parent} disappeared mid-run; training reads the "
                    "tokens it mapped at the start, and checkpoints carry the tokenizer read then"
                )
            try:
                path = save_checkpoint(
                    root,
                    state.step,
                    model_state,
                    self.model_cfg,
                    self.tokenizer,
                    state.to_json(),
                    self.config_yaml,
                    optim_state,
                    keep_last,
                    {**ranks[0], "ranks": ranks},
                )
            except ValueError as e:  # a refused write: one line, nothing lost
                error = e
        (failed,) = D.agree_max([int(error is not None)], info)
        if error is not None:
            raise error
        if failed:
            raise ValueError("rank 0 could not write the checkpoint (its error names the cause); stopping every rank")
        return path
