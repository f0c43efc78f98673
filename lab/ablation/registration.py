"""The protocol directory's record, protocol.yaml (the spec a resume continues with, every cell's state), and its
tamper-evident pre-registration: SHA-256s of the spec's pre-registered part, the cells' configs and the analysis code."""

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import yaml

from analysis.runs import NOT_A_VARIANT
from lab.ablation.configs import REGISTRATION_TAG
from lab.ablation.protocol import ProtocolError, Spec
from lab.sweep import file_digests
from training.program import REPO

MANIFEST = "protocol.yaml"
FORMAT = 2  # 2: pre-registered contrasts, LR seed apart from the measuring seeds, LR extensions

# The code that turns the cells' results into verdicts: a registration records its digest, and other code is refused.
ANALYSIS_CODE = ("analysis/stats.py", "lab/stats.py", "lab/ablation/contrasts.py", "lab/ablation/lr_search.py")

# The fields decided before any cell trains: all but planning_* and max_seeds, which only plan (power and cost).
PREREGISTERED = tuple(
    name for name in Spec.__dataclass_fields__ if not name.startswith("planning_") and name != "max_seeds"
)


def load(protocol_dir: Path) -> Optional[dict]:
    path = protocol_dir / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ProtocolError(f"cannot read {path} ({type(e).__name__}); restore it or start a new --dir")
    known = isinstance(manifest, dict) and manifest.get("format") == FORMAT and "spec" in manifest
    if not (known and manifest.get("registrations")):  # ablate.py registers a protocol before its first cell
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


# What a resume must not change (with the overrides, the primaries and what each name means): cells ran under them.
FIXED_ONCE_RUN = (
    "experiment reference min_lr_ratio stage1_seed lr_extensions lr_tie_tolerance alpha multitest equivalence_margin "
    "transfer_from"
).split()


def check_continuable(stored: Spec, new: Spec, manifest_path: Path) -> None:
    """A resume may add variants, sizes, LRs or seeds (new cells), but must not change what an
    existing name means: finished cells would silently mix two setups."""
    where = f"{manifest_path} was started with"
    if identity(stored.train_overrides) != identity(new.train_overrides):
        raise ProtocolError(
            f"{where} train.py overrides {' '.join(identity(stored.train_overrides)) or '(none)'}, "
            f"not {' '.join(identity(new.train_overrides)) or '(none)'}; pass the same ones, or none "
            "to reuse them, or use a new --dir"
        )
    for name in FIXED_ONCE_RUN:
        if getattr(stored, name) != getattr(new, name):
            raise ProtocolError(
                f"{where} {name}={getattr(stored, name)}, not {getattr(new, name)}; what trains, the LR choice and "
                "the pre-registered analysis are fixed once runs exist: use a new --dir"
            )
    if set(stored.primary) != set(new.primary):
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


def analysis_digest() -> str:
    """SHA-256 of the analysis code (ANALYSIS_CODE), each file named: what a verdict is reached by."""
    digest = hashlib.sha256()
    for name in ANALYSIS_CODE:
        digest.update(name.encode() + b"\0" + (REPO / name).read_bytes())
    return digest.hexdigest()


def git_commit() -> str:
    """The commit the code runs at, '<hash> dirty' when tracked files differ from it; 'unknown' outside git."""
    try:
        head, changes = (
            subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()
            for args in (["rev-parse", "HEAD"], ["status", "--porcelain", "--untracked-files=no"])
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head} dirty" if changes else head


def preregistered(spec: Spec, configs: Optional[Dict[str, str]] = None) -> dict:
    """The spec's pre-registered part, as plain data; with `configs` ({"size/variant": config_digest}), those and the
    analysis code's digest too."""
    data = spec.to_dict()
    part = {key: data[key] for key in PREREGISTERED}
    return part if configs is None else {**part, "configs": dict(configs), "analysis": analysis_digest()}


def fingerprint(part: dict) -> str:
    """SHA-256 of the part as canonical JSON (sorted keys): the same spec hashes the same on every machine."""
    return hashlib.sha256(json.dumps(part, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def register(manifest: dict, spec: Spec, command: str, configs: Dict[str, str]) -> Optional[dict]:
    """Record the spec's pre-registration (or, on a resume that changed it, an amendment); None when unchanged."""
    part = preregistered(spec, configs)
    records: List[dict] = manifest.setdefault("registrations", [])
    sha = fingerprint(part)
    if records and records[-1]["sha256"] == sha:
        return None
    record = {
        "sha256": sha,
        "registered": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": command,
        "commit": git_commit(),
        "preregistered": part,
    }
    if records:
        before = records[-1]["preregistered"]
        record["amends"] = sorted(key for key in part if before.get(key) != part[key])
    records.append(record)
    return record


def check(manifest: dict, spec: Spec, where: str) -> str:
    """One line naming the registration the spec matches; a ProtocolError when it matches none, or when a record no
    longer hashes to its own SHA-256 (edited by hand)."""
    records = manifest["registrations"]
    for record in records:
        if fingerprint(record["preregistered"]) != record["sha256"]:
            raise ProtocolError(
                f"{where}: the pre-registration of {record['registered']} no longer hashes to its "
                f"recorded {record['sha256'][:12]}: the manifest was edited by hand; restore it "
                "(git, a backup) or start a new --dir"
            )
    last, part = records[-1], preregistered(spec)
    changed = sorted(key for key in PREREGISTERED if last["preregistered"].get(key) != part[key])
    if changed:
        raise ProtocolError(
            f"{where}: the spec's {', '.join(changed)} no longer match(es) its pre-registration "
            f"{last['sha256'][:12]} of {last['registered']}: it was edited outside ablate.py; restore "
            "it, or start a new --dir"
        )
    first = records[0]
    amended = "".join(
        f"; amended {r['registered']} ({', '.join(r['amends'])}: {r['sha256'][:12]})" for r in records[1:]
    )
    return f"Pre-registered {first['registered']}, SHA-256 {first['sha256']}{amended}."


def check_configs(manifest: dict, configs: Dict[str, str], where: str) -> None:
    """A ProtocolError when a cell's composed config (its preset, a config group) differs from the last record's, or
    the analysis rule is not the one it names: edits no amendment made (a new cell's config is an amendment's)."""
    if not manifest.get("registrations"):  # a new protocol: registered next, with these configs
        return
    record = manifest["registrations"][-1]
    last, sha = record["preregistered"], record["sha256"][:12]
    if edited := sorted(cell for cell, digest in last["configs"].items() if configs.get(cell, digest) != digest):
        raise ProtocolError(
            f"{where}: the composed config of {', '.join(edited)} (its preset or a config group it runs) no longer "
            f"matches its pre-registration {sha} of {record['registered']}; restore the configs (git), or "
            "start a new --dir"
        )
    if last["analysis"] != analysis_digest():
        raise ProtocolError(
            f"{where}: registered to be judged by analysis code {last['analysis'][:12]}, but this "
            f"code's is {analysis_digest()[:12]} ({', '.join(ANALYSIS_CODE)}); report it with the code of its "
            f"registration: git checkout {record['commit'].split()[0]}"
        )


def current(manifest: dict) -> Optional[str]:
    """The SHA-256 the protocol runs under now (its last record), or None in a dry run (nothing recorded)."""
    records = manifest.get("registrations") or []
    return records[-1]["sha256"] if records else None


def check_cells(manifest: dict, states: Iterable, where) -> None:
    """Every cell that names a pre-registration in its config.yaml (a logger tag) must name one the manifest
    records: a manifest replaced by one registered afresh for an edited spec is refused, because the runs
    themselves still carry the hash they ran under."""
    recorded = {record["sha256"][:12] for record in manifest["registrations"]}
    for state in states:
        tags = ((state.run.config or {}).get("logger") or {}).get("tags") or [] if state.run is not None else []
        for tag in tags:
            if str(tag).startswith(REGISTRATION_TAG) and str(tag)[len(REGISTRATION_TAG) :] not in recorded:
                raise ProtocolError(
                    f"{where}: {state.cell.run_name} ran under pre-registration "
                    f"{str(tag)[len(REGISTRATION_TAG) :]}, which this manifest does not record: it was "
                    "replaced or registered afresh after runs existed; restore it or start a new --dir"
                )


def check_files(recorded: Dict[str, dict], runs_dir: Path, where) -> None:
    """A ProtocolError naming the first file of a done cell's run directory that changed since the manifest recorded
    it (a result edited by hand would otherwise be derived from); a cell whose directory is gone runs again."""
    for name, entry in recorded.items():
        path = runs_dir / name
        if not (entry.get("files") and path.is_dir()):
            continue
        now = file_digests(path)
        for file, digest in entry["files"].items():
            if now.get(file) != digest:
                raise ProtocolError(
                    f"{path / file} {'changed' if file in now else 'is gone'} since {where} recorded its cell as "
                    f"{entry['state']}; restore it (git, a backup), or delete {path} to run the cell again"
                )
