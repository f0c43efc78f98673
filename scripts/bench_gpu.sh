#!/usr/bin/env bash
# One short GPU benchmark: the ~125M config, bf16 + torch.compile, a few hundred steps on the
# embedded Shakespeare; prints tokens/s and MFU against the GPU's measured bf16 matmul peak.
# Usage (repo root, CUDA machine):  bash scripts/bench_gpu.sh [extra Hydra overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" - <<'PYEOF'
import torch
assert torch.cuda.is_available(), "bench_gpu.sh needs a CUDA GPU"
from training.mfu import measure_matmul_flops
dev = torch.device("cuda")
peak = measure_matmul_flops(dev, torch.bfloat16, n=8192, repeats=20)
print(f"GPU: {torch.cuda.get_device_name(dev)}; measured bf16 matmul peak {peak / 1e12:.0f} TFLOP/s")
open("/tmp/minillama_gpu_peak", "w").write(str(peak / 1e12))
PYEOF
PEAK=$(cat /tmp/minillama_gpu_peak)
"$PY" train.py model=125m trainer=gpu logger=none run_name=bench_gpu \
  trainer.max_steps=300 trainer.eval_interval=300 trainer.ckpt_interval=300 trainer.log_interval=50 \
  trainer.peak_tflops="$PEAK" data.vocab_size=32768 "$@" | tee /tmp/minillama_bench_gpu.log
RUN=$(ls -td outputs/*/*_bench_gpu | head -n 1)
"$PY" - "$RUN" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"train"' in l]
steady = rows[len(rows) // 2:]  # skip compile and warm-up
tps = sum(r["tokens_per_s"] for r in steady) / len(steady)
mfu = sum(r["mfu"] for r in steady) / len(steady)
print(f"steady state: {tps:,.0f} tokens/s, MFU {mfu:.1%} (against the measured peak)")
PYEOF
