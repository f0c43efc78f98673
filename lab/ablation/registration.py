"""The pre-registration, made tamper-evident: before the first cell trains, the manifest records the SHA-256 of
the spec's pre-registered part — what is compared (reference, variants, sizes, families), how it is judged
(α, the correction, the equivalence margin, power, the target MDE), the measuring seeds and the LR rule — with
the SHA-256 of every cell's composed config (the preset's and every config group's content) and of the analysis code,
the git commit ("dirty" when the tree has changes), the time and the command. Once any cell exists, register() refuses
a first record: the protocol stays unregistered. A resume that changes any of it through ablate.py (a variant or an LR added, as
check_continuable allows) records an amendment beside it; a spec edited any other way matches no record,
and a resume or a report then refuses in one line. The hash is printed so it can be published before the
results exist (a commit, a post): that, not this file, is what a reader outside the machine can check."""

import dataclasses
import hashlib
import json
import subprocess
import time
from typing import Dict, Iterable, List, Optional

from lab.ablation.configs import REGISTRATION_TAG
from lab.ablation.protocol import ProtocolError, Spec
from training.cli import REPO

# The code that turns the cells' results into verdicts: a registration records its digest, and other code is refused.
ANALYSIS_CODE = ("analysis/stats.py", "lab/stats.py", "lab/ablation/contrasts.py", "lab/ablation/lr_search.py")


# The fields decided before any cell trains. planning_sd and the stored throughput only plan; they are not here.
PREREGISTERED = (
    "experiment",
    "train_overrides",
    "reference",
    "variants",
    "sizes",
    "variant_sizes",
    "primary",
    "secondary",
    "alpha",
    "multitest",
    "equivalence_margin",
    "power",
    "target_mde",
    "seeds",
    "lr_grid",
    "stage1_seed",
    "lr_extensions",
    "lr_tie_tolerance",
    "min_lr_ratio",
    "transfer_from",
)


NOT_REGISTERED = (
    "Not pre-registered: no registration was recorded before its cells ran, so the spec below is the one it ran, "
    "not a hypothesis fixed in advance."
)


class TooLate(ProtocolError):
    """A first registration asked for once cells exist: it would fix a hypothesis after its results."""


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


def register(
    manifest: dict, spec: Spec, command: str, configs: Optional[Dict[str, str]] = None, cells_exist: bool = False
) -> Optional[dict]:
    """Record the spec's pre-registration in `manifest` (before its first cell trains), or an amendment when a
    resume changed it; the new record, or None when the spec is the one last registered. TooLate when no record
    exists and cells do."""
    if cells_exist and not manifest.get("registrations"):
        raise TooLate(
            "pre-registration refused: this protocol's cells ran before any registration, and one recorded now "
            "would follow its results; it stays not pre-registered, and its report says so"
        )
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
    """One line naming the registration the spec matches (check_configs holds the cells' configs and the rule); a
    ProtocolError when it matches none, or when a record no longer hashes to its own SHA-256 (edited by hand). A
    protocol without a record is not pre-registered, and says so."""
    records = manifest.get("registrations") or []
    if not records:
        return NOT_REGISTERED
    for record in records:
        if fingerprint(record["preregistered"]) != record["sha256"]:
            raise ProtocolError(
                f"{where}: the pre-registration of {record['registered']} no longer hashes to its "
                f"recorded {record['sha256'][:12]}: the manifest was edited by hand; restore it "
                "(git, a backup) or start a new --dir"
            )
    last, part = records[-1], preregistered(spec)
    # A field added to PREREGISTERED after this record was made is compared with its default: the behaviour then.
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(Spec)
        if f.name in PREREGISTERED and f.name not in last["preregistered"]
    }
    changed = sorted(
        [key for key in PREREGISTERED if key in last["preregistered"] and last["preregistered"][key] != part[key]]
        + [key for key in PREREGISTERED if key not in last["preregistered"] and part[key] != defaults[key]]
    )
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
    records = manifest.get("registrations") or []
    last = records[-1]["preregistered"] if records else {}
    recorded, sha = last.get("configs") or {}, records[-1]["sha256"][:12] if records else ""
    if edited := sorted(cell for cell, digest in recorded.items() if configs.get(cell, digest) != digest):
        raise ProtocolError(
            f"{where}: the composed config of {', '.join(edited)} (its preset or a config group it runs) no longer "
            f"matches its pre-registration {sha} of {records[-1]['registered']}; restore the configs (git), or "
            "start a new --dir"
        )
    if "configs" in last and last.get("analysis", "none recorded") != analysis_digest():
        raise ProtocolError(
            f"{where}: registered to be judged by analysis code {last.get('analysis', 'none recorded')[:12]}, but this "
            f"code's is {analysis_digest()[:12]} ({', '.join(ANALYSIS_CODE)}); report it with the code of its "
            f"registration: git checkout {records[-1].get('commit', '<its commit>').split()[0]}"
        )


def current(manifest: dict) -> Optional[str]:
    """The SHA-256 the protocol runs under now (its last record), or None before registration existed."""
    records = manifest.get("registrations") or []
    return records[-1]["sha256"] if records else None


def check_cells(manifest: dict, states: Iterable, where) -> None:
    """Every cell that names a pre-registration in its config.yaml (a logger tag) must name one the manifest
    records: a manifest replaced by one registered afresh for an edited spec is refused, because the runs
    themselves still carry the hash they ran under. Cells from before registration name none."""
    recorded = {record["sha256"][:12] for record in manifest.get("registrations") or []}
    for state in states:
        tags = ((state.run.config or {}).get("logger") or {}).get("tags") or [] if state.run is not None else []
        for tag in tags:
            if str(tag).startswith(REGISTRATION_TAG) and str(tag)[len(REGISTRATION_TAG) :] not in recorded:
                raise ProtocolError(
                    f"{where}: {state.cell.run_name} ran under pre-registration "
                    f"{str(tag)[len(REGISTRATION_TAG) :]}, which this manifest does not record: it was "
                    "replaced or registered afresh after runs existed; restore it or start a new --dir"
                )
