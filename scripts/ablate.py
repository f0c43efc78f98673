"""Run an ablation protocol end to end: every variant at its own best learning rate, paired seeds,
one or more model sizes, then the report — one command, resumable.

    python scripts/ablate.py                                   # configs/protocol/default.yaml
    python scripts/ablate.py --dir multirun/ablate/<date>/<time>   # resume: the stored spec, finished cells kept
    python scripts/ablate.py --variants rmsnorm_swiglu,gelu --lrs 1e-3,3e-3 --seeds 3 \\
        --sizes "model.hidden_size=96,192 model.n_heads=2,4" trainer.max_steps=300 hydra/launcher=submitit_slurm

Stage 1 trains each variant at each LR of the grid (one seed) at each size; stage 2 trains every
variant at its own best stage-1 LR on every seed; stage 3 writes <dir>/report/ (results.md and the
figures). Each stage is one `python train.py -m` multirun; trailing key=value arguments go to every
train.py run (hydra/launcher=… and hydra.launcher.… choose the launcher). Before training it
prints the cost, from a short timing run of each size. Rerunning with the same --dir skips
finished and diverged cells, resumes interrupted ones from their checkpoints and retries failed
ones. Exit status: 0 done, 1 an error (one `error:` line), 2 runs stopped at trainer.stop_at_step,
130/143 stopped by Ctrl-C/SIGTERM (rerun to continue).
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis import cells as C  # noqa: E402
from analysis import cost, launch, manifest, protocol_report  # noqa: E402
from analysis.protocol import (ProtocolError, Spec, at_grid_edge, load_spec_file, merge_overrides, parse_sizes,  # noqa: E402
                               split_overrides, stage1_cells, stage2_cells)
from analysis.runs import RunsError  # noqa: E402
from scripts.ablate_configs import cell_values, validate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROTOCOL = REPO / "configs" / "protocol" / "default.yaml"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="train.py overrides for every run "
                   "(e.g. trainer.max_steps=300 data.cache_dir=…), and hydra/launcher=… for the launcher")
    p.add_argument("--protocol", type=Path, default=None,
                   help=f"protocol file (default: {DEFAULT_PROTOCOL.relative_to(REPO)})")
    p.add_argument("--dir", type=Path, default=None, help="protocol directory; an existing one is resumed "
                   "(default: multirun/ablate/<date>/<time>)")
    p.add_argument("--variants", default=None, help="comma-separated subset of the protocol's variants")
    p.add_argument("--variant", action="append", default=[], metavar="'NAME KEY=VALUE …'",
                   help="add or define a variant, one quoted argument, e.g. --variant 'relu2 model.mlp=relu2' "
                   "(repeatable)")
    p.add_argument("--reference", default=None, help="the variant the others are compared with")
    p.add_argument("--lrs", default=None, help="stage-1 LR grid, comma-separated (e.g. 1e-3,3e-3,1e-2)")
    p.add_argument("--seeds", type=int, default=None, help="stage-2 seeds 0..N-1 (default: the protocol's)")
    p.add_argument("--stage1-seed", type=int, default=None, help="the seed of the LR sweep")
    p.add_argument("--sizes", default=None, metavar="'KEY=V1,V2 …'",
                   help="model sizes as sweep terms, zipped, one quoted argument, e.g. "
                   "'model.hidden_size=96,192 model.n_heads=2,4'")
    p.add_argument("--probe-steps", type=int, default=10, help="steps of the timing run per size before "
                   "the cost is printed (0: no timing run; the cost is estimated once stage 1 has runs)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its cost, then stop")
    p.add_argument("--report-only", action="store_true", help="only write the report from what has finished")
    return p.parse_intermixed_args(argv)  # overrides may come before, between or after the options


def build_spec(args, stored: Spec = None, train_overrides=()) -> Spec:
    """The protocol file's spec (or the stored one on resume), changed by the command line."""
    base = stored if stored is not None and args.protocol is None else load_spec_file(args.protocol or DEFAULT_PROTOCOL)
    fields = base.to_dict()
    for definition in args.variant:
        name, *overrides = definition.split()
        fields["variants"][name] = overrides
    if args.variants:
        keep = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = [v for v in keep if v not in fields["variants"]]
        if unknown:
            raise ProtocolError(f"--variants: unknown {', '.join(unknown)}; the protocol has "
                                f"{', '.join(fields['variants'])}")
        fields["variants"] = {v: fields["variants"][v] for v in keep}
    if args.reference:
        fields["reference"] = args.reference
    if args.lrs:
        try:
            fields["lr_grid"] = [float(x) for x in args.lrs.split(",")]
        except ValueError:
            raise ProtocolError(f"--lrs {args.lrs!r} is not a comma-separated list of numbers, e.g. 1e-3,3e-3")
    if args.seeds is not None:
        fields["seeds"] = list(range(args.seeds))
    if args.stage1_seed is not None:
        fields["stage1_seed"] = args.stage1_seed
    if args.sizes:
        fields["sizes"] = parse_sizes(args.sizes.split())
    fields["train_overrides"] = merge_overrides(fields["train_overrides"], train_overrides)
    return Spec(**fields)


class Protocol:
    """The protocol directory and its manifest."""

    def __init__(self, args):
        train_overrides, launcher = split_overrides(args.overrides)
        self.dir = (args.dir or Path("multirun/ablate") / time.strftime("%Y-%m-%d/%H-%M-%S")).resolve()
        stored = manifest.load(self.dir)
        if stored is None and self.dir.is_dir() and any(self.dir.iterdir()):
            raise ProtocolError(f"{self.dir} is not empty and holds no {manifest.MANIFEST}; choose a new --dir")
        self.spec = build_spec(args, manifest.spec_of(stored) if stored else None, train_overrides)
        if stored:
            manifest.check_continuable(manifest.spec_of(stored), self.spec, self.dir / manifest.MANIFEST)
        self.data = stored or {"id": "ablate_" + time.strftime("%Y-%m-%d_%H-%M-%S"),
                               "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.launcher = launcher or (stored or {}).get("launcher_overrides", [])
        self.resumed = stored is not None
        if args.report_only and not self.resumed:
            raise ProtocolError(f"--report-only: {self.dir} holds no protocol ({manifest.MANIFEST}); pass its --dir")
        self.runs_dir = self.dir / "runs"

    def save(self, **fields) -> None:
        self.data.update(fields, spec=self.spec.to_dict(), launcher_overrides=self.launcher,
                         command=" ".join([Path(sys.argv[0]).name] + sys.argv[1:]))
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
        configs[s.cell.option] = launch.cell_config(s.cell, values[(s.cell.size, s.cell.variant)],
                                                    proto.spec.min_lr_ratio, proto.data["id"], stage, resume)
    config_dir = proto.dir / "configs" / stage
    launch.write_cells(config_dir, configs)
    resumed = sum(s.state == C.RESUMABLE for s in todo)
    print(f"\n==> {stage}: {len(todo)} of {len(cells)} runs to do" + (f" ({resumed} resumed)" if resumed else ""),
          flush=True)
    overrides = [o for o in proto.spec.train_overrides if o.split("=", 1)[0] not in {e.split("=", 1)[0] for e in extra}]
    command = launch.sweep_command(sys.executable, REPO / "train.py", proto.spec.experiment,
                                   [*overrides, *extra, *proto.launcher], config_dir, sweep_dir, list(configs))
    start = time.time()
    status = launch.run_sweep(command, cwd=Path.cwd())
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


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        proto = Protocol(args)
        models, budgets = validate(proto.spec)
        values = cell_values(proto.spec)
        proto.save(models=models)
        print(("resuming " if proto.resumed else "protocol directory: ") + str(proto.dir))
        if not args.report_only:
            seconds, source = measure(proto, budgets, args.probe_steps, values)
            print_cost(proto, seconds, source)
            if args.dry_run:
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
    except (ProtocolError, RunsError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


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


if __name__ == "__main__":
    sys.exit(main())
