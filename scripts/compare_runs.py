"""Compare finished runs: a markdown table (mean ± std over seeds), validation curves and per-layer RMS.

Usage: python scripts/compare_runs.py multirun/<date>/<time> [more run or sweep dirs] [--out DIR]
Writes results.md, val_curves.png and activation_rms.png into --out (default: <first input>/comparison)
and prints the table. Runs that differ only in seed are one variant; incomplete runs are skipped with
a warning; no complete run, or an unreadable one, is a one-line error and exit status 1.
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis.plots import has_activation_rms, plot_activation_rms, plot_val_curves  # noqa: E402
from analysis.runs import RunsError, group_variants, read_complete_runs  # noqa: E402
from analysis.table import markdown, summarize_variants  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", type=Path, help="run directories, or directories to search for runs "
                   "(e.g. a Hydra multirun directory)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: <first path>/comparison)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = args.out or args.paths[0] / "comparison"
    try:
        runs, skipped = read_complete_runs(args.paths)
        variants = group_variants(runs)
        table = markdown(summarize_variants(variants), skipped)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text(table)
        plot_val_curves(variants, out / "val_curves.png")
        written = ["results.md", "val_curves.png"]
        if has_activation_rms(variants):
            plot_activation_rms(variants, out / "activation_rms.png")
            written.append("activation_rms.png")
        else:
            print("warning: no activation_rms.png: some runs logged no rms_residual "
                  "(trainer.activation_rms=false)", file=sys.stderr)
    except (RunsError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(table)
    print(f"{len(runs)} runs, {len(variants)} variants → {out}/{{{','.join(written)}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
