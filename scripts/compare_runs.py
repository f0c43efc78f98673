"""Compare finished runs: a markdown table (mean ± std over seeds), paired Δ against a reference
variant (95 % CI, paired t-test, Welch beside it), validation curves, per-layer RMS and a forest plot.

Usage: python scripts/compare_runs.py multirun/<date>/<time> [more run or sweep dirs] [--out DIR]
           [--reference model.norm=rmsnorm model.mlp=swiglu]
Writes results.md, val_curves.png, time_to_quality.png (val bpb against wall-clock seconds), activation_rms.png
and forest.png into --out (default:
<first input>/comparison) and prints the tables. Runs that differ only in seed are one variant;
incomplete runs are skipped with a warning; no complete run, or an unreadable one, is a one-line
error and exit status 1. For a protocol directory of lab/ablate.py use `ablate.py --report-only`.
"""

import argparse
import sys
from pathlib import Path

import _bootstrap  # noqa: F401  (the repository root on sys.path; TORCHINDUCTOR_CACHE_DIR checked)

from analysis import reference as ref
from analysis.plots import has_activation_rms, plot_activation_rms, plot_forest, plot_time_to_quality, plot_val_curves
from analysis.runs import RunsError, group_variants, read_complete_runs
from analysis.table import markdown, summarize_variants
from training.program import description, run


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument(
        "paths",
        nargs="+",
        type=Path,
        help="run directories, or directories to search for runs (e.g. a Hydra multirun directory)",
    )
    p.add_argument("--out", type=Path, default=None, help="output directory (default: <first path>/comparison)")
    p.add_argument(
        "--reference",
        nargs="+",
        metavar="KEY=VALUE",
        default=None,
        help="config values that make a variant the reference (default: "
        f"{' '.join(ref.DEFAULT_REFERENCE)}; keys the runs lack are ignored); every other variant "
        "is compared with the reference that shares its remaining differing keys",
    )
    return p.parse_args(argv)


def comparisons(variants, reference_args) -> tuple:
    """(Versus pairs, note). An explicit --reference that matches no variant is an error."""
    spec = ref.parse_reference(reference_args or ref.DEFAULT_REFERENCE)
    references = ref.references_by_config(variants, spec)
    if not any(references.values()):
        wanted = " ".join(f"{k}={v}" for k, v in spec.items())
        if reference_args:
            raise RunsError(
                f"--reference {wanted} matches none of the variants: " + "; ".join(v.label for v in variants)
            )
        return [], f"No reference variant ({wanted}) among the runs: no paired Δ; pick one with --reference."
    return ref.versus_reference(variants, references), ""


def main(argv=None) -> int:
    args = parse_args(argv)
    out = args.out or args.paths[0] / "comparison"
    runs, skipped = read_complete_runs(args.paths)  # a RunsError: one error line
    variants = group_variants(runs)
    pairs, note = comparisons(variants, args.reference)
    table = markdown(summarize_variants(variants), skipped)
    if pairs or note:
        table += "\n## Paired Δ against the reference\n\n" + (ref.markdown(pairs) if pairs else note + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(table)
    plot_val_curves(variants, out / "val_curves.png")
    written = ["results.md", "val_curves.png"]
    if any(r.eval_seconds() for v in variants for r in v.runs):
        plot_time_to_quality(variants, out / "time_to_quality.png")
        written.append("time_to_quality.png")
    if any(p.comparison.test for p in pairs):  # with one seed there is no interval to draw
        plot_forest(
            {"": [(p.variant.label, p.comparison.test, p.comparison.outcome) for p in pairs]},
            out / "forest.png",
            pairs[0].reference.label,
        )
        written.append("forest.png")
    if has_activation_rms(variants):
        plot_activation_rms(variants, out / "activation_rms.png")
        written.append("activation_rms.png")
    else:
        print(
            "warning: no activation_rms.png: some runs logged no rms_residual (trainer.activation_rms=false)",
            file=sys.stderr,
        )
    print(table)
    print(f"{len(runs)} runs, {len(variants)} variants → {out}/{{{','.join(written)}}}")
    return 0


if __name__ == "__main__":
    run(main)
