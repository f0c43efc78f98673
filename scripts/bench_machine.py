"""What a start decides about the machine, start after start: the precision `auto` chooses and the MFU peak.

Usage: python scripts/bench_machine.py [--starts 8] [--hogs 2] [--isa AVX2] [--threads 2] [--kept FILE]
Every option: --help. The program itself is devtools/bench/machine.py; this file is its door.
"""
import _bootstrap  # noqa: F401  (the repository root on sys.path)
from cli.entry import run
from devtools.bench.machine import main

if __name__ == "__main__":
    run(main)
