"""Run an ablation protocol end to end: every variant at its own best learning rate (chosen on a seed of
its own) and at the reference's, paired measuring seeds, one or more model sizes, then the pre-registered
verdicts — one command, resumable.

Its commands, stages and exit statuses: docs/ablation/README.md.
"""

import argparse
import sys
import time
from pathlib import Path

from lab import CONFIGS, SEARCH_PATH
from lab.ablation import registration
from lab.ablation.configs import apply_transfer, cell_values, validate
from lab.ablation.protocol import ProtocolError, Spec, load_spec_file, merge_overrides, parse_sizes, split_overrides
from lab.ablation.runner import Protocol, report, run_stages, spread_from
from lab.stats import check_added_seeds
from training.cli import override_values
from training.program import REPO, compose_train_config, description, run

DEFAULT_PROTOCOL = CONFIGS / "protocol" / "default.yaml"
PROBE_STEPS = 10  # the timing run's steps per size, when one is made


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="train.py overrides for every run (e.g. trainer.max_steps=300), and hydra/launcher=… for the launcher",
    )
    p.add_argument("--protocol", type=Path, help=f"protocol file (default: {DEFAULT_PROTOCOL.relative_to(REPO)})")
    p.add_argument(
        "--dir", type=Path, help="protocol directory, resumed if it exists (default: multirun/ablate/<date>/<time>)"
    )
    p.add_argument("--variants", help="comma-separated subset of the protocol's variants")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'NAME KEY=VALUE …'",
        help="add or define a variant, one quoted argument, e.g. --variant 'relu2 model.mlp=relu2' (repeatable)",
    )
    p.add_argument("--reference", help="the variant the others are compared with")
    p.add_argument("--lrs", help="stage-1 LR grid, comma-separated (e.g. 1e-3,3e-3,1e-2)")
    p.add_argument(
        "--seeds",
        help="measuring seeds 0..N-1, or 'auto': as many as the target MDE needs at the planning spread, up to max_seeds",
    )
    p.add_argument(
        "--spread-from",
        type=Path,
        metavar="DIR",
        help="a pilot protocol (directory or protocol.yaml) whose per-seed paired differences give the planning spread",
    )
    p.add_argument(
        "--sequential",
        action="store_true",
        help="allow seeds beyond those a report judged (each look then judged at α / looks)",
    )
    p.add_argument("--stage1-seed", type=int, help="the seed of the LR sweep")
    p.add_argument(
        "--sizes",
        metavar="'KEY=V1,V2 …'",
        help="model sizes as sweep terms, zipped, one quoted argument, e.g. 'model.hidden_size=96,192 model.n_heads=2,4'",
    )
    p.add_argument(
        "--transfer-from",
        metavar="SIZE",
        help="tune LRs only at this size, under μP, and reuse them at every size (a width ladder; docs/mup.md)",
    )
    p.add_argument(
        "--probe-steps",
        type=int,
        help="steps of the timing run per size before the cost is printed (default 10; 0 with --dry-run, and "
        "0: no timing run)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan, its power and (once timed) its cost; write nothing"
    )
    p.add_argument("--report-only", action="store_true", help="only write the report from what has finished")
    return p.parse_intermixed_args(argv)  # overrides may come before, between or after the options


def build_spec(args, stored: Spec = None, train_overrides=()) -> Spec:
    """The protocol file's spec (or the stored one on resume), changed by the command line."""
    base = stored if stored is not None and args.protocol is None else load_spec_file(args.protocol or DEFAULT_PROTOCOL)
    fields = base.to_dict()
    for definition in args.variant:
        name, *overrides = definition.split()
        fields["variants"][name] = overrides
        if fields["secondary"] and name not in fields["primary"] + fields["secondary"] + [fields["reference"]]:
            fields["secondary"].append(name)  # a variant added on the command line is never a primary contrast
    if args.variants:
        keep = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = [v for v in keep if v not in fields["variants"]]
        if unknown:
            raise ProtocolError(
                f"--variants: unknown {', '.join(unknown)}; the protocol has {', '.join(fields['variants'])}"
            )
        fields["variants"] = {v: fields["variants"][v] for v in keep}
        for tier in ("primary", "secondary"):
            fields[tier] = [v for v in fields[tier] if v in keep]
        fields["variant_sizes"] = {v: at for v, at in fields["variant_sizes"].items() if v in keep}
    if args.reference:
        fields["reference"] = args.reference
    if args.lrs:
        try:
            fields["lr_grid"] = [float(x) for x in args.lrs.split(",")]
        except ValueError:
            raise ProtocolError(f"--lrs {args.lrs!r} is not a comma-separated list of numbers, e.g. 1e-3,3e-3")
    if args.spread_from is not None:
        sd, dof, source = spread_from(args.spread_from)
        fields["planning_sd"], fields["planning_sd_source"] = round(sd, 6), f"{source} ({dof} dof)"
    if args.seeds is not None:
        if args.seeds != "auto" and not args.seeds.isdigit():
            raise ProtocolError(f"--seeds {args.seeds!r} is not a number of seeds or 'auto'")
        fields["seeds"] = "auto" if args.seeds == "auto" else list(range(int(args.seeds)))
    if args.stage1_seed is not None:
        fields["stage1_seed"] = args.stage1_seed
    if args.sizes:
        fields["sizes"] = parse_sizes(args.sizes.split())
    if args.transfer_from:
        fields["transfer_from"] = args.transfer_from
    fields["train_overrides"] = merge_overrides(fields["train_overrides"], train_overrides)
    return Spec(**fields)


def open_protocol(args) -> Protocol:
    """The protocol directory the command line names (a new one, or a resume with its stored spec)."""
    train_overrides, launcher = split_overrides(args.overrides)
    directory = (args.dir or Path("multirun/ablate") / time.strftime("%Y-%m-%d/%H-%M-%S")).resolve()
    stored = registration.load(directory)
    if stored is None and directory.is_dir() and any(directory.iterdir()):
        raise ProtocolError(f"{directory} is not empty and holds no {registration.MANIFEST}; choose a new --dir")
    spec = build_spec(args, registration.spec_of(stored) if stored else None, train_overrides)
    apply_transfer(spec, typed_config)  # before the comparison: a stored spec holds the μP overrides it added
    if stored:
        old, where = registration.spec_of(stored), directory / registration.MANIFEST
        registration.check(stored, old, where)  # not edited by hand
        registration.check_continuable(old, spec, where)
        check_added_seeds(stored.get("looks") or [], {"stage2": spec.seeds}, args.sequential, "or start a new --dir")
    if args.report_only and stored is None:
        raise ProtocolError(f"--report-only: {directory} holds no protocol ({registration.MANIFEST}); pass its --dir")
    return Protocol(
        directory,
        spec,
        stored,
        launcher,
        command=" ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        sequential=args.sequential,
    )


def typed_config(overrides: list):
    """The TrainConfig train.py would run with these overrides (a cell that does not compose: a ValueError)."""
    return compose_train_config([SEARCH_PATH, *overrides])[0]


def main(argv=None) -> int:
    args = parse_args(argv)
    proto = open_protocol(args)
    configs = {}
    models, budgets = validate(proto.spec, typed_config, configs)
    registration.check_configs(proto.data, configs, proto.dir / registration.MANIFEST)  # a preset edited since: refused
    values = cell_values(proto.spec, override_values)
    probe_steps = args.probe_steps if args.probe_steps is not None else (0 if args.dry_run else PROBE_STEPS)
    # A dry run writes nothing, not even its plan (a directory left behind would be a protocol begun); one
    # told to time (--probe-steps N) writes its timing runs, and the manifest that names them.
    proto.writes = not (args.dry_run and probe_steps == 0 and not args.report_only)
    registered = None
    if proto.writes and not args.report_only:  # before the first cell trains
        registered = registration.register(proto.data, proto.spec, proto.command, configs)
    dry = "" if proto.writes else " (a dry run: nothing is written)"
    print(f"{'resuming' if proto.resumed else 'protocol directory:'} {proto.dir}{dry}")
    if registered:
        what = (
            f"pre-registration amended ({', '.join(registered['amends'])})"
            if "amends" in registered
            else "pre-registered"
        )
        print(
            f"{what}: SHA-256 {registered['sha256']} at {registered['registered']} (publish it before the results exist)"
        )
    elif not proto.writes:
        sha = registration.fingerprint(registration.preregistered(proto.spec, configs))
        print(f"pre-registration: SHA-256 {sha} (recorded when the protocol starts)")
    proto.data["models"] = models
    if args.report_only:
        return report(proto)  # it writes only once every check has passed
    return run_stages(proto, budgets, values, probe_steps, args.dry_run)


if __name__ == "__main__":
    run(main)
