"""Mutation score per target of dev/mutation.sh, from mutmut's results in mutants/.

    python -m dev.mutation_score [--survivors] [--dir mutants] [--doc docs/testing.md]
    python -m dev.mutation_score --todo 'training.loop.*'   # what is left to run of those, a name a line

score = killed / (tested − equivalent), where "equivalent" are the surviving mutants docs/testing.md
lists as behaving exactly like the original (each with its reason), and a timeout counts as killed
(the mutant made a test hang: the suite noticed). Exit 1 if a target is below 90 %, or if a mutant
listed as equivalent no longer exists or is now killed (the list must stay true).
"""

import argparse
import fnmatch
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from training.cli import REPO, description, run

TARGETS = (
    "model",
    "training/checkpoint",
    "training/optim",
    "data/loader.py",
    "analysis/stats.py",
    "training/step.py",
    "training/loop.py",
    "training/evaluation.py",
    "training/loss.py",
)
REQUIRED = 0.90
# mutmut's exit codes (mutmut/stats.py): 1 and 3 failed a test; 24/36/-24/152/255 a CPU-time limit.
KILLED, TIMEOUT, SURVIVED = {1, 3}, {24, 36, -24, 152, 255}, {0}
EQUIVALENT_SECTION = "## Surviving mutants judged equivalent"


def target_of(path: str) -> str:
    return next(t for t in TARGETS if path == t or path.startswith(t + "/"))


def load_results(mutants: Path) -> dict:
    """{mutant name: (its target, exit code or None)} for every mutant of every target file. The target comes
    from the file mutmut recorded the mutant in (a name alone cannot tell `pkg/__init__.py` from `pkg.py`)."""
    results = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        source = meta.relative_to(mutants).as_posix()[: -len(".meta")]
        if not any(source == t or source.startswith(t + "/") for t in TARGETS):
            continue
        target = target_of(source)
        results.update(
            (name, (target, code)) for name, code in json.loads(meta.read_text())["exit_code_by_key"].items()
        )
    return results


def equivalent_mutants(doc: Path) -> set:
    """The `mutant names` in the table under docs/testing.md's equivalent-mutants heading."""
    text = doc.read_text(encoding="utf-8")
    if EQUIVALENT_SECTION not in text:
        return set()
    section = text.split(EQUIVALENT_SECTION, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)`", section, flags=re.MULTILINE))


def todo(patterns: list, results: dict, equivalent: set) -> list:
    """What `dev/mutation.sh run PATTERN…` has left to run: the mutants a glob matches that have no result
    yet or survived without being judged equivalent (mutmut itself reruns every mutant a name matches). A
    name without glob characters stands as given: naming a mutant reruns it, as mutmut does."""
    names = [p for p in patterns if not any(c in p for c in "*?[")]
    globs = [p for p in patterns if p not in names]
    if not results:  # nothing has run: the globs go to mutmut as they are
        return names + globs
    left = [
        n
        for n, (_, code) in sorted(results.items())
        if any(fnmatch.fnmatchcase(n, g) for g in globs)
        and (code is None or (code in SURVIVED and n not in equivalent))
    ]
    return names + [n for n in left if n not in names]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--survivors", action="store_true", help="list the surviving mutants not judged equivalent")
    parser.add_argument(
        "--todo",
        nargs="+",
        metavar="GLOB",
        help="print the mutants matching GLOB (mutmut's names) "
        "not run yet or surviving unexplained, one a line: what dev/mutation.sh runs for GLOB",
    )
    parser.add_argument("--dir", type=Path, default=REPO / "mutants", help="mutmut's working directory")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "testing.md", help="the equivalent-mutant table")
    args = parser.parse_args(argv)
    results = load_results(args.dir)
    if args.todo:
        for name in todo(args.todo, results, equivalent_mutants(args.doc)):
            print(name)
        return 0
    if not results:
        print(f"error: no mutation results in {args.dir}; run dev/mutation.sh first", file=sys.stderr)
        return 1
    equivalent = equivalent_mutants(args.doc)
    stale = sorted(n for n in equivalent if results.get(n, (None, "missing"))[1] not in SURVIVED)
    counts = defaultdict(lambda: defaultdict(int))
    survivors = []
    for name, (target_name, code) in sorted(results.items()):
        target = counts[target_name]
        target["mutants"] += 1
        if code is None:
            target["not run"] += 1
        elif code in KILLED or code in TIMEOUT:
            target["killed"] += 1
        elif code in SURVIVED and name in equivalent:
            target["equivalent"] += 1
        elif code in SURVIVED:
            target["survived"] += 1
            survivors.append(name)
        else:  # 33/5: no test calls the function at all — a gap like a survivor
            target["no tests"] += 1
            survivors.append(name)
    print(
        f"{'target':24} {'mutants':>7} {'killed':>7} {'equiv.':>7} {'survived':>8} {'no test':>7} "
        f"{'not run':>7} {'score':>7}"
    )
    failing = []
    for target in TARGETS:
        c = counts[target]
        judged = c["killed"] + c["survived"] + c["no tests"]
        score = c["killed"] / judged if judged else float("nan")
        if c["not run"] or not judged or score < REQUIRED:
            failing.append(target)
        print(
            f"{target:24} {c['mutants']:7} {c['killed']:7} {c['equivalent']:7} {c['survived']:8} "
            f"{c['no tests']:7} {c['not run']:7} {score:7.1%}"
        )
    if args.survivors:
        print("\nsurviving (not judged equivalent):", *survivors, sep="\n  ")
    if stale:
        print(
            f"\nerror: docs/testing.md lists {len(stale)} equivalent mutant(s) that did not survive or no longer "
            f"exist (update the table): {', '.join(stale)}",
            file=sys.stderr,
        )
    if failing:
        print(f"\nbelow {REQUIRED:.0%} (or not fully run): {', '.join(failing)}", file=sys.stderr)
    return 1 if failing or stale else 0


if __name__ == "__main__":
    run(main)
