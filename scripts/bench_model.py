"""Training-step throughput of minillama vs Hugging Face LlamaForCausalLM, same shapes, eager and compiled.

Usage: python scripts/bench_model.py [--shape cpu|25m|125m|tiny] [--compile] [--optim adamw[,muon]] [--layers 6,4] …
Every option: --help. The program itself is devtools/bench/model.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.model import main

if __name__ == "__main__":
    run(main)
