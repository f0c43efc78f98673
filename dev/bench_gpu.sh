#!/usr/bin/env bash
# One short GPU benchmark: the ~125M config with trainer=gpu (bf16, torch.compile, 32 × 1024 × 4 tokens
# per step, vocab 32768) for a few hundred steps; prints tokens/s, MFU against the GPU's measured bf16
# matmul peak and against its data sheet, peak memory and compile time.
# Usage (repo root, CUDA machine, data_cache prepared by ../shared/gpu/pack.sh data.vocab_size=32768):
#   bash dev/bench_gpu.sh [extra overrides]        e.g. trainer.max_steps=300
# BENCH_OUT=dir keeps the run there (default: a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
command -v "$PY" >/dev/null 2>&1 || PY=python3
OUT=${BENCH_OUT:-$(mktemp -d -t minillama_bench_gpu.XXXXXX)}
STEPS=${BENCH_STEPS:-150}

PEAK=$("$PY" - <<'PYEOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("error: bench_gpu.sh needs a CUDA GPU (torch.cuda.is_available() is False)")
from training.runtime.mfu import measure_matmul_flops
peak = measure_matmul_flops(torch.device("cuda"), torch.bfloat16, n=8192, repeats=20)
print(f"{peak / 1e12:.1f}")
PYEOF
)
echo "bench_gpu: measured bf16 matmul peak (8192³, best of 20): $PEAK TFLOP/s"

"$PY" train.py model=125m trainer=gpu logger=none data.vocab_size=32768 run_name=bench_gpu outputs_dir="$OUT" \
  trainer.max_steps="$STEPS" trainer.eval_interval="$STEPS" trainer.ckpt_interval="$STEPS" trainer.log_interval=20 \
  trainer.eval_windows=64 trainer.peak_tflops="$PEAK" "$@"

"$PY" - "$OUT" "$PEAK" <<'PYEOF'
import glob, json, statistics, sys
import torch
from training.runtime.mfu import gpu_peak
out, measured_peak = sys.argv[1], float(sys.argv[2]) * 1e12
(metrics,) = glob.glob(f"{out}/*/*_bench_gpu/metrics.jsonl")
rows = [json.loads(line) for line in open(metrics) if '"train"' in line]
steady = [r for r in rows[len(rows) // 2:] if r.get("compile_s", 0) == rows[-1].get("compile_s", 0)]
tps = statistics.median(r["tokens_per_s"] for r in steady)
mfu = statistics.median(r["mfu"] for r in steady)  # against the measured peak (trainer.peak_tflops)
name = torch.cuda.get_device_name(0)
sheet = gpu_peak(name)
vs_sheet = f", {mfu * measured_peak / sheet.bf16:.1%} of the {sheet.label} data sheet" if sheet else ""
memory = max(r.get("peak_memory_gb", float("nan")) for r in rows)
print(f"bench_gpu: {name}, torch {torch.__version__}: {tps:,.0f} tokens/s (median of the last {len(steady)} "
      f"log intervals), MFU {mfu:.1%} of the measured bf16 peak {measured_peak / 1e12:.0f} TFLOP/s{vs_sheet}; "
      f"peak memory {memory:.1f} GiB (CUDA max allocated); compile {rows[-1].get('compile_s', 0):.0f} s")
print(f"bench_gpu: metrics {metrics}")
PYEOF
