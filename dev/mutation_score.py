"""Mutation score per target of dev/mutation.sh (pyproject.toml's [tool.mutmut] only_mutate), from mutmut's
results in mutants/.

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
import tomllib
from collections import defaultdict
from pathlib import Path

from training.program import REPO, description, run

TARGETS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]  # e.g. "model/*"
REQUIRED = 0.90
# mutmut's exit codes (mutmut/stats.py): 1 and 3 failed a test; 24/36/-24/152/255 a CPU-time limit.
KILLED, TIMEOUT, SURVIVED = {1, 3}, {24, 36, -24, 152, 255}, {0}
EQUIVALENT_SECTION = "## Surviving mutants judged equivalent"


def load_results(mutants: Path) -> dict:
    """{mutant name: (its target, exit code or None)} for every mutant of every target file. The target comes
    from the file mutmut recorded the mutant in (a name alone cannot tell `pkg/__init__.py` from `pkg.py`)."""
    results = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        source = meta.relative_to(mutants).as_posix()[: -len(".meta")]
        target = next((t for t in TARGETS if fnmatch.fnmatchcase(source, t)), None)
        if target is None:
            continue
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


COLUMNS = ("mutants", "killed", "equivalent", "survived", "no tests", "not run")


def outcome(name: str, code, equivalent: set) -> str:
    """A mutant's column: a timeout counts as killed; 33/5 (no test calls the function) is a gap like a survivor."""
    if code is None:
        return "not run"
    if code in KILLED or code in TIMEOUT:
        return "killed"
    if code in SURVIVED:
        return "equivalent" if name in equivalent else "survived"
    return "no tests"


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
    outcomes = {name: outcome(name, code, equivalent) for name, (_, code) in results.items()}
    survivors = sorted(n for n, o in outcomes.items() if o in ("survived", "no tests"))
    counts = defaultdict(lambda: defaultdict(int))
    for name, (target, _) in results.items():
        counts[target]["mutants"] += 1
        counts[target][outcomes[name]] += 1
    print(f"{'target':24}" + "".join(f" {column:>10}" for column in (*COLUMNS, "score")))
    failing = []
    for target in TARGETS:
        c = counts[target]
        judged = c["killed"] + c["survived"] + c["no tests"]
        score = c["killed"] / judged if judged else float("nan")
        if c["not run"] or not judged or score < REQUIRED:
            failing.append(target)
        print(f"{target:24}" + "".join(f" {c[column]:10}" for column in COLUMNS) + f" {score:10.1%}")
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
