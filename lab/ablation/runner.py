"""Running the protocol in its directory: each stage one multirun (lab/sweep.py) of the cells not yet done, their
states recorded in the manifest, the cost and the power printed before each stage, then stage 3, the report."""

import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

from lab import stats as power
from lab import sweep
from lab.ablation import protocol as C
from lab.ablation import registration
from lab.ablation import report as protocol_report
from lab.ablation.configs import cell_config
from lab.ablation.lr_search import edge_note
from lab.ablation.protocol import ProtocolError, Spec, lr_sweep, stage2_cells
from lab.launcher import Job, Launcher
from lab.stats import alpha_for
from lab.stats import record as looks_record


class Protocol:
    """The protocol directory and its manifest."""

    def __init__(
        self,
        directory: Path,
        spec: Spec,
        stored: Optional[dict],
        launcher: List[str],
        command: str,
        sequential: bool = False,
    ):
        """stored: its manifest (a resume) or None; launcher: the hydra/launcher overrides; sequential: seeds may
        be added after a look (lab/stats.py)."""
        self.dir, self.spec, self.command, self.sequential = directory, spec, command, sequential
        self.data = stored or {
            "id": "ablate_" + time.strftime("%Y-%m-%d_%H-%M-%S"),
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        self.launcher = launcher or (stored or {}).get("launcher_overrides", [])
        self.resumed = stored is not None
        self.runs_dir = self.dir / "runs"
        self.writes = True  # False for a dry run: the manifest is kept in memory only

    def save(self, **fields) -> None:
        self.data.update(fields, spec=self.spec.to_dict(), launcher_overrides=self.launcher, command=self.command)
        if not self.writes:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        registration.save(self.dir, self.data)

    def states(self, cells, root: Path = None) -> dict:
        return {cell: C.inspect(cell, root or self.runs_dir) for cell in cells}

    def stage1(self) -> dict:
        """Every stage-1 cell's state: the grid's and the extensions' its results call for."""
        return C.stage1_states(self.spec, self.states)

    @property
    def planning_source(self) -> str:
        return self.spec.planning_sd_source or "the spec's planning_sd"

    def record(self, states: dict, chosen=None) -> None:
        cells = {**(self.data.get("cells") or {}), **{s.cell.run_name: cell_entry(s) for s in states.values()}}
        self.save(cells=cells, **({"chosen_lr": chosen} if chosen is not None else {}))


def cell_entry(s) -> dict:
    """What the manifest records of a cell: its state, final bpb and error."""
    entry = {"state": s.state}
    if s.final_bpb is not None:
        entry["val_bpb"] = round(s.final_bpb, 6)
    if s.error:
        entry["error"] = s.error
    if s.state in sweep.DONE:  # never written again: an edit is refused (check_files)
        entry["files"] = sweep.file_digests(s.path)
    return entry


def run_cells(proto: Protocol, cells, stage: str, sweep_dir: Path, extra=(), values=None) -> int:
    """Run the cells not yet done as one multirun; returns its exit status (0 if nothing to do)."""
    jobs = [
        Job(
            sweep_dir / c.run_name,
            cell_config(
                c,
                values[(c.size, c.variant)],
                proto.spec.min_lr_ratio,
                proto.data["id"],
                stage,
                registration.current(proto.data),
            ),
            name=c.option,
        )
        for c in cells
    ]
    todo = sweep.pending(jobs, sweep_dir, proto.dir / "discarded", say=lambda message: print(f"{stage}: {message}"))
    if not todo:
        return 0
    resumed = sum("resume" in j.values for j in todo)
    print(
        f"\n==> {stage}: {len(todo)} of {len(cells)} runs to do" + (f" ({resumed} resumed)" if resumed else ""),
        flush=True,
    )
    # One multirun a stage: its jobs one after another in one process, or on a cluster (hydra/launcher=…).
    launcher = Launcher(
        proto.dir / "configs" / stage, proto.spec.overrides(*extra), one_process=True, cluster=proto.launcher
    )
    start = time.time()
    results = proto.dir / sweep.RESULTS if sweep_dir == proto.runs_dir and proto.writes else None
    for _ in sweep.launch(todo, launcher, sweep_dir, results, lambda ended, s: {"stage": stage}):
        pass  # each cell's state is read from its directory after the stage
    status = launcher.status
    wall = time.time() - start
    print(f"==> {stage}: {len(todo)} runs took {wall / 60:.1f} min ({wall / len(todo):.0f} s per run)", flush=True)
    walls = dict(proto.data.get("wall_s") or {})
    walls[stage] = round(walls.get(stage, 0.0) + wall, 1)  # summed over resumes
    proto.save(wall_s=walls)
    return status


def after_stage(proto: Protocol, cells, stage: str, status: int) -> int:
    """Record the cells' states; 0 to go on, else the exit status to end with (and why, printed)."""
    states = proto.states(cells)
    proto.record(states)
    for s in states.values():
        if s.state == sweep.DIVERGED:
            print(f"{stage}: {s.cell.run_name} diverged ({s.error.split(';')[0]}); recorded, not run again")
    if status >= 128:
        print(f"{stage} stopped by a signal; continue with: python -m lab.ablate --dir {proto.dir}")
        return status
    failed = [s for s in states.values() if s.state == sweep.FAILED]
    for s in failed:
        print(f"error: {s.cell.run_name} failed: {s.error}", file=sys.stderr)
    missing = [s for s in states.values() if s.state not in sweep.DONE and s.state != sweep.FAILED]
    if failed or (missing and status != 0):
        print(
            f"error: {stage}: {len(failed) + len(missing)} of {len(cells)} runs did not finish (exit status "
            f"{status}; see the output above); rerun with --dir {proto.dir} to retry them",
            file=sys.stderr,
        )
        return 1
    if missing:  # stopped on purpose (trainer.stop_at_step): a later rerun continues them
        print(
            f"{stage}: {len(missing)} runs stopped before trainer.max_steps; continue with: "
            f"python -m lab.ablate --dir {proto.dir}"
        )
        return 2
    return 0


def measure(proto: Protocol, budgets: dict, probe_steps: int, values: dict) -> tuple:
    """({size: seconds per run or None}, source) through lab/sweep.py's estimate: this protocol's finished runs,
    else a short timing run of the reference at each size (made once, kept in probe/), else the stored throughput
    (planning_tokens_per_s) where no override changes what a step costs."""
    spec = proto.spec
    finished = {
        size: [s.run for s in proto.stage1().values() if s.cell.size == size and s.state == sweep.FINISHED]
        for size in spec.sizes
    }
    cells = [C.Cell(size, spec.reference, min(spec.lr_grid), spec.stage1_seed) for size in spec.sizes]
    probe_dir = proto.dir / "probe"

    def timing():
        probes = proto.states(cells, probe_dir)
        if not all(s.state == sweep.FINISHED for s in probes.values()):
            if probe_steps <= 0:
                return None
            print(f"timing run: {probe_steps} steps of {spec.reference} at each size, to estimate the cost", flush=True)
            run_cells(proto, cells, "probe", probe_dir, sweep.timing_overrides(probe_steps), values)
            probes = proto.states(cells, probe_dir)
        return {c.size: s for c, s in probes.items()}

    same_step = all(o.split("=")[0].startswith(SAME_THROUGHPUT) for o in spec.train_overrides)
    try:
        return sweep.estimate(
            budgets,
            finished,
            timing,
            "size",
            spec.planning_tokens_per_s if same_step else {},
            f"the protocol's stored throughput, {spec.planning_tokens_per_s_source} (another machine may be 2-4× "
            "off: --probe-steps 10 times each size here)",
        )
    except ValueError as e:
        raise ProtocolError(f"{e}; its error is above: fix it, or skip the timing run with --probe-steps 0") from None


# Overrides that change what a run costs in steps, not what a step costs: a stored throughput still holds.
SAME_THROUGHPUT = tuple(
    "trainer.max_steps trainer.max_epochs trainer.eval_interval trainer.ckpt_interval trainer.log_interval "
    "data.cache_dir logger.".split()
)


# --- what the protocol will cost and can detect ---

SWEEP_STARTUP_S = 10.0  # one `train.py -m` process per stage: imports, data cache lookup


@dataclass
class Line:
    size: str
    params: int  # the reference's parameters at this size
    seconds: Optional[float]  # per run; None = not measured
    stage1: int  # runs to do
    stage2: int

    @property
    def total_s(self) -> Optional[float]:
        return None if self.seconds is None else self.seconds * (self.stage1 + self.stage2)


def table(lines: List[Line], source: str, done: int) -> str:
    """The cost, printed before anything trains and written into the manifest."""
    w = max(10, *(len(line.size) + 1 for line in lines))
    out = [f"{'size':<{w}} {'params':>8} {'per run':>9} {'stage 1':>8} {'stage 2':>8} {'time':>10}"]
    for line in lines:
        out.append(
            f"{line.size:<{w}} {line.params / 1e6:>7.2f}M {_s(line.seconds):>9} {line.stage1:>8} "
            f"{line.stage2:>8} {_min(line.total_s):>10}"
        )
    runs = sum(line.stage1 + line.stage2 for line in lines)
    known = [line.total_s for line in lines]
    sweeps = any(x.stage1 for x in lines) + any(x.stage2 for x in lines)  # one multirun a stage
    total = None if None in known else sum(known) + sweeps * SWEEP_STARTUP_S
    out.append(
        f"{'total':<{w}} {'':>8} {'':>9} {sum(x.stage1 for x in lines):>8} "
        f"{sum(x.stage2 for x in lines):>8} {_min(total):>10}"
    )
    out.append(f"{runs} runs to do ({done} already finished or diverged); per-run time from {source}")
    return "\n".join(out)


def transfer_saving(spec, seconds: Dict[str, Optional[float]]) -> dict:
    """What transfer_from saves: the LR grid's runs at every other size, which stage 1 then never trains
    ({} without transfer_from). Extensions past an edge would have cost more; they are not counted."""
    if not spec.transfer_from:
        return {}
    skipped = {
        size: len(spec.variants_at(size)) * len(spec.lr_grid) for size in spec.sizes if size != spec.transfer_from
    }
    known = all(seconds.get(size) is not None for size in skipped)
    minutes = sum(n * seconds[size] for size, n in skipped.items()) / 60 if known else None
    text = (
        f"transfer_from {spec.transfer_from} (μP): stage 1 sweeps LRs only there and every size reuses them; "
        f"{sum(skipped.values())} grid runs at {', '.join(skipped) or 'no other size'} are not trained, saving "
        + ("? min (no timing yet)" if minutes is None else f"{minutes:.1f} min")
        + " (extensions not counted)"
    )
    return {"text": text, "runs": sum(skipped.values()), "minutes": None if minutes is None else round(minutes, 1)}


def _s(seconds: Optional[float]) -> str:
    return "?" if seconds is None else f"{seconds:.0f} s"


def _min(seconds: Optional[float]) -> str:
    return "?" if seconds is None else f"{seconds / 60:.1f} min"


def summary(lines: List[Line]) -> Dict[str, dict]:
    """The cost as the manifest stores it."""
    return {
        line.size: {
            "seconds_per_run": None if line.seconds is None else round(line.seconds, 1),
            "stage1_runs": line.stage1,
            "stage2_runs": line.stage2,
        }
        for line in lines
    }


RUN_NAME = re.compile(r"^(?P<size>[^/]+)/(?P<variant>[^/]+)/lr(?P<lr>[^_/]+)_seed(?P<seed>\d+)$")


def manifest_values(manifest: dict) -> Dict[Tuple[str, str, float], Dict[int, float]]:
    """{(size, variant, lr): {seed: final val bpb}} of a manifest's finished cells."""
    values = {}
    for name, cell in (manifest.get("cells") or {}).items():
        m = RUN_NAME.match(name)
        if m and isinstance(cell, dict) and cell.get("val_bpb") is not None:
            key = (m["size"], m["variant"], float(m["lr"]))
            values.setdefault(key, {})[int(m["seed"])] = float(cell["val_bpb"])
    return values


def paired_differences(manifest: dict, variants: Sequence[str]) -> Dict[str, List[float]]:
    """{'size/variant': per-seed (variant − reference) bpb} on the manifest's measuring seeds, each variant
    at its chosen LR against the reference at its own: the spread a study's paired tests see."""
    spec, chosen = manifest["spec"], manifest.get("chosen_lr") or {}
    values, seeds, reference = manifest_values(manifest), set(spec["seeds"]), spec["reference"]
    diffs = {}
    for size, per_size in chosen.items():
        if per_size.get(reference) is None:
            continue
        ref = values.get((size, reference, float(per_size[reference])), {})
        for variant in variants:
            if per_size.get(variant) is None:
                continue
            mine = values.get((size, variant, float(per_size[variant])), {})
            common = sorted(seeds & set(mine) & set(ref))
            if len(common) >= 2:
                diffs[f"{size}/{variant}"] = [mine[s] - ref[s] for s in common]
    return diffs


def spread_from(path: Path, variants: Optional[Sequence[str]] = None) -> Tuple[float, int, str]:
    """(pooled sd of paired differences, its degrees of freedom, where from) of a pilot protocol: its
    directory or its protocol.yaml. Variants: the manifest's primaries, else every non-reference one."""
    file = path / "protocol.yaml" if path.is_dir() else path
    try:
        manifest = yaml.safe_load(file.read_text())
        spec = manifest["spec"]
    except (OSError, yaml.YAMLError, TypeError, KeyError) as e:
        raise ProtocolError(
            f"--spread-from {path}: not a protocol manifest ({type(e).__name__}); pass a protocol "
            "directory or its protocol.yaml"
        )
    variants = list(variants or spec.get("primary") or [v for v in spec["variants"] if v != spec["reference"]])
    diffs = paired_differences(manifest, variants)
    sd = power.pooled_sd(diffs)
    if sd is None:
        raise ProtocolError(
            f"--spread-from {path}: no variant of {', '.join(variants)} has two paired seeds with "
            f"the reference; finish its stage 2 first"
        )
    return sd, power.pooled_dof(diffs), f"{file}: {', '.join(sorted(diffs))}"


def power_table(spec: Spec, sd: Optional[float], source: str) -> str:
    """Per family: its size, the strictest Holm level, the planned seeds and their MDE at 80 % power."""
    if sd is None:
        return "power: no planning spread (set planning_sd or pass --spread-from a pilot): MDE unknown"
    lines = [
        f"power: two-sided paired t-test, {spec.power:.0%} power, at each family's strictest Holm level "
        f"α/m; spread of per-seed paired differences sd = {sd:.4f} bpb ({source})",
        f"{'family':<10} {'contrasts':>22} {'α/m':>8} {'seeds':>6} {'MDE':>11} {'MDE/sd':>7}",
    ]
    for tier in spec.tiers:
        a, mde = spec.family_alpha(tier), spec.mde(tier, sd)
        m = f"{len(spec.family(tier))} variant(s), {len(spec.family_tests(tier))} tests"
        lines.append(f"{tier:<10} {m:>22} {a:>8.4f} {len(spec.seeds):>6} {mde:>7.4f} bpb {mde / sd:>7.2f}")
    needed = power.seeds_for(spec.target_mde, sd, spec.family_alpha("primary"), spec.power)
    lines.append(
        f"target: primary MDE ≤ {spec.target_mde:g} bpb needs "
        + (f"{needed} seeds" if needed else f"more than {power.MAX_SEEDS} seeds")
        + f" at this spread; planned {len(spec.seeds)}"
        + (
            ""
            if needed and needed <= len(spec.seeds)
            else " (the target is not met: read 'can't tell' as 'too few seeds', never as 'the same')"
        )
        + "; the MDE is proportional to the spread (MDE/sd), which longer runs may shrink"
    )
    return "\n".join(lines)


def print_cost(proto: Protocol, seconds: dict, source: str, before: str = "stage1") -> None:
    """Runs still to do per size and stage × seconds per run, then the power of the planned seeds.
    Stage 2's LRs may not be known yet: then every variant but the reference counts twice per seed
    (its own LR and the reference's), as if they never coincided."""
    spec = proto.spec
    s1 = proto.stage1()
    chosen = C.chosen_lrs(spec, s1)
    lines, done, extensions = [], sum(s.state in sweep.DONE for s in s1.values()), 0
    for size in spec.sizes:
        stage2 = 0
        for variant in spec.variants_at(size):
            if variant not in chosen[size]:
                stage2 += len(spec.seeds) * (1 if variant == spec.reference else 2)
                if size in spec.sweep_sizes:
                    extensions += spec.lr_extensions - lr_sweep(spec, size, variant, C.done_bpb(s1)).extensions
            elif spec.reference not in chosen[size]:  # its shared-LR cells wait for the reference's LR
                stage2 += len(spec.seeds)
        states = proto.states([c for c in stage2_cells(spec, chosen) if c.size == size])
        stage2 += sum(s.state not in sweep.DONE for s in states.values())
        done += sum(s.state in sweep.DONE for s in states.values())
        lines.append(
            Line(
                size,
                proto.data["models"][size][spec.reference]["total"],
                seconds[size],
                sum(s.state not in sweep.DONE for s in s1.values() if s.cell.size == size),
                stage2,
            )
        )
    print(
        f"\n{len(spec.sizes)} size(s) × {len(spec.variants)} variants; stage 1: {len(spec.lr_grid)} LRs on seed "
        f"{spec.stage1_seed} (+ up to {spec.lr_extensions} past an edge); stage 2: seeds "
        f"{', '.join(map(str, spec.seeds))} at each variant's own best LR and at {spec.reference}'s"
    )
    print(table(lines, source, done))
    if extensions:
        print(f"+ up to {extensions} stage-1 extension runs if best LRs land at the grid's edge (not counted above)")
    saved = transfer_saving(spec, seconds)
    if saved:
        print(saved["text"])
    print(power_table(spec, spec.planning_sd, proto.planning_source), flush=True)
    estimates = {
        **(proto.data.get("cost") or {}),
        f"before {before}": {
            "source": source,
            **summary(lines),
            "possible_extensions": extensions,
            **({"transfer_saves": {k: v for k, v in saved.items() if k != "text"}} if saved else {}),
        },
    }
    proto.save(cost=estimates)


def run_stage1(proto: Protocol, values: dict) -> int:
    """The LR sweeps: the grid as one multirun, then a multirun of the points past an edge the results
    call for, round after round until every sweep is settled (interior, capped or diverged)."""
    rounds = 0
    while True:
        states = proto.stage1()
        todo = [c for c, s in states.items() if s.state not in sweep.DONE]
        if not todo:
            return 0
        if rounds:
            print(
                "stage1: best LR at the grid's edge: one more point beyond it for "
                + ", ".join(f"{c.size}/{c.variant} ({c.lr:g})" for c in todo),
                flush=True,
            )
        cells = list(states)
        status = after_stage(proto, cells, "stage1", run_cells(proto, cells, "stage1", proto.runs_dir, values=values))
        if status:
            return status
        rounds += 1


def run_stages(proto: Protocol, budgets: dict, values: dict, probe_steps: int, dry_run: bool) -> int:
    """The cost and power, stage 1 (the LR sweeps), the chosen LRs, stage 2 (every seed at them), then the
    report; an exit status (0 done, 1 failed runs, 2 runs stopped early, 128 + N a signal)."""
    registration.check_files(proto.data.get("cells") or {}, proto.runs_dir, proto.dir / registration.MANIFEST)
    proto.save()  # the registration, before the first cell trains
    seconds, source = measure(proto, budgets, probe_steps, values)
    print_cost(proto, seconds, source)
    if dry_run:
        return 0
    status = run_stage1(proto, values)
    if status:
        return status
    s1 = proto.stage1()
    chosen = C.chosen_lrs(proto.spec, s1)
    proto.record(s1, chosen)
    print_chosen(proto.spec, s1, chosen)
    s2 = stage2_cells(proto.spec, chosen)
    print_cost(proto, *measure(proto, budgets, 0, values), before="stage2")
    status = after_stage(proto, s2, "stage2", run_cells(proto, s2, "stage2", proto.runs_dir, values=values))
    if status:
        return status
    return report(proto)


def print_chosen(spec: Spec, states: dict, chosen: dict) -> None:
    done = C.done_bpb(states)
    for size, per_variant in chosen.items():
        text = ", ".join(
            f"{v} "
            + ("none" if lr is None else f"{lr:g}")
            + f" ({edge_note(lr_sweep(spec, size, v, done), spec.lr_extensions)})"
            for v, lr in per_variant.items()
        )
        print(f"stage1: best LR at {size}: {text}")


def report(proto: Protocol) -> int:
    spec = proto.spec
    states = proto.stage1()
    chosen = C.chosen_lrs(spec, states)
    states.update(proto.states(stage2_cells(spec, chosen)))
    out, where = proto.dir / "report", proto.dir / registration.MANIFEST
    if all(s.state == sweep.MISSING for s in states.values()) and proto.data.get("cells"):
        raise ProtocolError(
            f"{where}: none of its {len(states)} cells' runs is in {proto.runs_dir} (a copy without its runs?): there "
            "is nothing to derive the results from; report where the runs are (tests/test_ablation_docs.py recomputes "
            "the published contrasts from per_seed.csv)"
        )
    recorded = proto.data.get("cells") or {}
    registration.check_files(recorded, proto.runs_dir, where)
    unchanged = all(recorded.get(s.cell.run_name) == cell_entry(s) for s in states.values())
    registered = registration.check(proto.data, spec, where)  # a spec edited by hand: refused (configs: ablate.py)
    registration.check_cells(proto.data, states.values(), where)  # or a manifest replaced
    looks = looks_record(proto.data.get("looks") or [], {"stage2": spec.seeds}, proto.sequential)
    with tempfile.TemporaryDirectory() as fresh:  # derived anew from the cells' runs, then held against the old
        text = protocol_report.write(
            spec,
            states,
            chosen,
            Path(fresh),
            f"Ablation protocol {proto.data['id']}",
            registered,
            proto.planning_source,
            alpha_for(spec.alpha, looks, "stage2"),
        )
        for name in protocol_report.FILES if unchanged else ():  # the same runs must give the same files, byte for byte
            if (out / name).exists() and (out / name).read_bytes() != (Path(fresh) / name).read_bytes():
                raise ProtocolError(
                    f"{out / name} differs from what its cells' runs give (edited by hand, or written by other code); "
                    "restore it (git), or delete it to derive it anew"
                )
        shutil.copytree(fresh, out, dirs_exist_ok=True)
    proto.save(looks=looks)
    proto.record(states, chosen)
    print(text)
    print(f"report: {out}/results.md")
    return 0
