"""The benchmarks' one entry point: `python -m dev.bench NAME [options]`, NAME one of the modules below
(model, data, generate, checkpoint, train_overhead, budget, newton_schulz); `NAME --help` for its options."""

import importlib
import sys

from training.program import run

NAMES = ("model", "data", "generate", "checkpoint", "train_overhead", "budget", "newton_schulz")

if __name__ == "__main__":
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) < 2 or sys.argv[1] not in NAMES:
        given = f"'{sys.argv[1]}' is no benchmark" if len(sys.argv) > 1 else "no benchmark named"
        sys.exit(f"error: {given}; run python -m dev.bench NAME [options], NAME one of {', '.join(NAMES)}")
    name = sys.argv.pop(1)
    sys.argv[0] = f"python -m dev.bench {name}"
    run(importlib.import_module(f"dev.bench.{name}").main)
