"""Running the protocol in its directory: each stage one multirun of the cells not yet done, every
cell's state recorded in the manifest after it, the cost printed before each stage (from a short timing
run of each size, or the runs already finished), then stage 3, the report."""
import sys
import time
from pathlib import Path
from typing import List, Optional

from analysis.ablation import cells as C
from analysis.ablation import cost, manifest
from analysis.ablation import report as protocol_report
from analysis.ablation.configs import cell_config, sweep_command, write_cells
from analysis.ablation.protocol import ProtocolError, Spec, at_grid_edge, stage1_cells, stage2_cells
from analysis.jobs import TRAIN_PY, run_sweep


class Protocol:
    """The protocol directory and its manifest."""

    def __init__(self, directory: Path, spec: Spec, stored: Optional[dict], launcher: List[str], command: str):
        """directory: resolved; stored: its manifest (a resume) or None (a new protocol); launcher: the
        hydra/launcher overrides; command: the command line, recorded in the manifest."""
        self.dir, self.spec, self.command = directory, spec, command
        self.data = stored or {"id": "ablate_" + time.strftime("%Y-%m-%d_%H-%M-%S"),
                               "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.launcher = launcher or (stored or {}).get("launcher_overrides", [])
        self.resumed = stored is not None
        self.runs_dir = self.dir / "runs"

    def save(self, **fields) -> None:
        self.data.update(fields, spec=self.spec.to_dict(), launcher_overrides=self.launcher,
                         command=self.command)
        self.dir.mkdir(parents=True, exist_ok=True)
        manifest.save(self.dir, self.data)

    def states(self, cells, root: Path = None) -> dict:
        return {cell: C.inspect(cell, root or self.runs_dir) for cell in cells}

    def record(self, states: dict, chosen=None) -> None:
        cells = dict(self.data.get("cells") or {})
        for s in states.values():
            entry = {"state": s.state}
            if s.final_bpb is not None:
                entry["val_bpb"] = round(s.final_bpb, 6)
            if s.error:
                entry["error"] = s.error
            cells[s.cell.run_name] = entry
        self.save(cells=cells, **({"chosen_lr": chosen} if chosen is not None else {}))


def run_cells(proto: Protocol, cells, stage: str, sweep_dir: Path, extra=(), values=None) -> int:
    """Run the cells not yet done as one multirun; returns its exit status (0 if nothing to do)."""
    states = proto.states(cells, sweep_dir)
    todo = [s for s in states.values() if s.state not in C.DONE]
    if not todo:
        return 0
    configs = {}
    for s in todo:
        if s.state in (C.FAILED, C.RESTART):
            print(f"{stage}: {s.cell.run_name} {s.state}{': ' + s.error if s.error else ''}; moved to "
                  f"{C.move_aside(s, proto.dir / 'discarded')}, running it again")
        resume = s.path if s.state == C.RESUMABLE else None
        configs[s.cell.option] = cell_config(s.cell, values[(s.cell.size, s.cell.variant)], proto.spec.min_lr_ratio,
                                             proto.data["id"], stage, resume)
    config_dir = proto.dir / "configs" / stage
    write_cells(config_dir, configs)
    resumed = sum(s.state == C.RESUMABLE for s in todo)
    print(f"\n==> {stage}: {len(todo)} of {len(cells)} runs to do" + (f" ({resumed} resumed)" if resumed else ""),
          flush=True)
    overrides = [o for o in proto.spec.train_overrides if o.split("=", 1)[0] not in {e.split("=", 1)[0] for e in extra}]
    command = sweep_command(sys.executable, TRAIN_PY, proto.spec.experiment, [*overrides, *extra, *proto.launcher],
                            config_dir, sweep_dir, list(configs))
    start = time.time()
    status = run_sweep(command, cwd=Path.cwd())
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
        if s.state == C.DIVERGED:
            print(f"{stage}: {s.cell.run_name} diverged ({s.error.split(';')[0]}); recorded, not run again")
    if status >= 128:
        print(f"{stage} stopped by a signal; continue with: python scripts/ablate.py --dir {proto.dir}")
        return status
    failed = [s for s in states.values() if s.state == C.FAILED]
    for s in failed:
        print(f"error: {s.cell.run_name} failed: {s.error}", file=sys.stderr)
    missing = [s for s in states.values() if s.state not in C.DONE and s.state != C.FAILED]
    if failed or (missing and status != 0):
        print(f"error: {stage}: {len(failed) + len(missing)} of {len(cells)} runs did not finish (exit status "
              f"{status}; see the output above); rerun with --dir {proto.dir} to retry them", file=sys.stderr)
        return 1
    if missing:  # stopped on purpose (trainer.stop_at_step): a later rerun continues them
        print(f"{stage}: {len(missing)} runs stopped before trainer.max_steps; continue with: "
              f"python scripts/ablate.py --dir {proto.dir}")
        return 2
    return 0


def measure(proto: Protocol, budgets: dict, probe_steps: int, values: dict) -> tuple:
    """({size: seconds per run or None}, source): from this protocol's finished runs if every size
    has some, else from a short timing run of the reference at each size (made once, kept in probe/)."""
    spec = proto.spec
    finished = {size: [s.run for s in proto.states(stage1_cells(spec)).values()
                       if s.cell.size == size and s.state == C.FINISHED] for size in spec.sizes}
    if all(finished.values()):
        return {size: cost.run_seconds(budgets[size], runs) for size, runs in finished.items()}, "this protocol's runs"
    # The smallest LR: throughput does not depend on it, and it is the least likely to diverge.
    probes = [C.Cell(size, spec.reference, min(spec.lr_grid), spec.stage1_seed) for size in spec.sizes]
    probe_dir = proto.dir / "probe"
    states = proto.states(probes, probe_dir)
    if not all(s.state == C.FINISHED for s in states.values()):
        if probe_steps <= 0:
            return {size: None for size in spec.sizes}, "nothing yet (--probe-steps 0)"
        print(f"timing run: {probe_steps} steps of {spec.reference} at each size, to estimate the cost", flush=True)
        extra = [f"trainer.max_steps={probe_steps}", f"trainer.eval_interval={probe_steps}",
                 f"trainer.ckpt_interval={probe_steps}", f"trainer.log_interval={max(1, probe_steps // 5)}",
                 "logger.wandb=disabled"]
        status = run_cells(proto, probes, "probe", probe_dir, extra, values)
        states = proto.states(probes, probe_dir)
        if status != 0 or not all(s.state == C.FINISHED for s in states.values()):
            raise ProtocolError(f"the timing run failed (exit status {status}; its error is above); fix it, or "
                                "skip it with --probe-steps 0")
    steps = {s.run.max_steps for s in states.values()}.pop()
    return ({s.cell.size: cost.run_seconds(budgets[s.cell.size], [s.run]) for s in states.values()},
            f"a {steps}-step timing run of each size")


def print_cost(proto: Protocol, seconds: dict, source: str, before: str = "stage1") -> None:
    """Runs still to do per size and stage × seconds per run. Stage 2's LRs may not be known yet:
    then every variant is counted with its seeds, less the one stage 1 provides."""
    spec = proto.spec
    s1 = proto.states(stage1_cells(spec))
    chosen = C.chosen_lrs(spec, s1)
    lines, done = [], sum(s.state in C.DONE for s in s1.values())
    for size in spec.sizes:
        stage2 = 0
        for variant in spec.variants:
            if variant not in chosen[size]:
                stage2 += len([s for s in spec.seeds if s != spec.stage1_seed])
            elif chosen[size][variant] is not None:
                states = proto.states([C.Cell(size, variant, chosen[size][variant], s) for s in spec.seeds])
                stage2 += sum(s.state not in C.DONE for s in states.values())
                done += sum(s.state in C.DONE and s.cell.seed != spec.stage1_seed for s in states.values())
        lines.append(cost.Line(size, proto.data["models"][size][spec.reference]["total"], seconds[size],
                               sum(s.state not in C.DONE for s in s1.values() if s.cell.size == size), stage2))
    print(f"\n{len(spec.sizes)} size(s) × {len(spec.variants)} variants; stage 1: {len(spec.lr_grid)} LRs × seed "
          f"{spec.stage1_seed}; stage 2: seeds {', '.join(map(str, spec.seeds))} at each variant's best LR"
          + (f" (seed {spec.stage1_seed} is stage 1's run)" if spec.stage1_seed in spec.seeds else ""))
    print(cost.table(lines, source, done, stages=2), flush=True)
    estimates = {**(proto.data.get("cost") or {}), f"before {before}": {"source": source, **cost.summary(lines)}}
    proto.save(cost=estimates)


def run_stages(proto: Protocol, budgets: dict, values: dict, probe_steps: int, dry_run: bool) -> int:
    """The cost, stage 1 (the LR sweep), the chosen LRs, stage 2 (every seed at them), then the report;
    an exit status (0 done, 1 failed runs, 2 runs stopped early, 128 + N a signal)."""
    seconds, source = measure(proto, budgets, probe_steps, values)
    print_cost(proto, seconds, source)
    if dry_run:
        return 0
    s1 = stage1_cells(proto.spec)
    status = after_stage(proto, s1, "stage1", run_cells(proto, s1, "stage1", proto.runs_dir, values=values))
    if status:
        return status
    chosen = C.chosen_lrs(proto.spec, proto.states(s1))
    proto.record(proto.states(s1), chosen)
    print_chosen(proto.spec, chosen)
    s2 = stage2_cells(proto.spec, chosen)
    print_cost(proto, *measure(proto, budgets, 0, values), before="stage2")
    status = after_stage(proto, s2, "stage2", run_cells(proto, s2, "stage2", proto.runs_dir, values=values))
    if status:
        return status
    return report(proto)


def print_chosen(spec: Spec, chosen: dict) -> None:
    for size, per_variant in chosen.items():
        text = ", ".join(f"{v} diverged at every LR (try lower --lrs)" if lr is None else
                         f"{v} {lr:g}" + (" (⚠ the grid's edge)" if at_grid_edge(lr, spec.lr_grid) else "")
                         for v, lr in per_variant.items())
        print(f"stage1: best LR at {size}: {text}")


def report(proto: Protocol) -> int:
    spec = proto.spec
    states = proto.states(stage1_cells(spec))
    chosen = C.chosen_lrs(spec, states)
    states.update(proto.states(stage2_cells(spec, chosen)))
    out = proto.dir / "report"
    text = protocol_report.write(spec, states, chosen, out, f"Ablation protocol {proto.data['id']}")
    proto.record(states, chosen)
    print(text)
    print(f"report: {out}/results.md")
    return 0
