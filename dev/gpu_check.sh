#!/usr/bin/env bash
# The GPU check in one go (well under 8 minutes on one H200): the CUDA-marked tests (bf16 training step,
# chunked loss, compile, generate with KV cache, HF parity, resume within bf16 tolerance, FSDP2 on one
# GPU under torchrun), then dev/bench_gpu.sh (125m: tokens/s, MFU, peak memory); a summary at the end.
# Usage (repo root):  bash dev/gpu_check.sh [--dry-run]
#   on an offline GPU machine:  LOG_DIR=/some/dir bash .whl/on-device.sh bash dev/gpu_check.sh
#   (data_cache/ prepared by ../shared/gpu/pack.sh data.vocab_size=32768, see ../shared/gpu/README.md)
# --dry-run lists what would run and exits 0, on any machine.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
command -v "$PY" >/dev/null 2>&1 || PY=python3
TESTS_TIMEOUT=${TESTS_TIMEOUT:-180}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}

STEPS=(
  "tests|$TESTS_TIMEOUT|$PY -m pytest -q -m cuda tests/test_cuda.py"
  "bench|$BENCH_TIMEOUT|bash dev/bench_gpu.sh"
)

case "${1:-}" in
  --dry-run)
    echo "gpu_check.sh would run, in this order (each with a time limit):"
    for step in "${STEPS[@]}"; do
      IFS='|' read -r name limit cmd <<<"$step"
      echo "  [$name, ≤ ${limit} s] $cmd"
    done
    echo "then print a summary (test results; tokens/s, MFU and peak memory of the 125m config)"
    exit 0 ;;
  "") ;;
  *) echo "error: unknown argument '$1'; usage: bash dev/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "error: no CUDA GPU here (torch.cuda.is_available() is False); run on a GPU machine, or --dry-run" >&2
  exit 1
fi

LOGS=$(mktemp -d -t minillama_gpu_check.XXXXXX)
declare -A STATUS SECONDS_TAKEN
START=$(date +%s)
for step in "${STEPS[@]}"; do
  IFS='|' read -r name limit cmd <<<"$step"
  echo "=== $name: $cmd"
  t0=$(date +%s)
  timeout --signal=INT --kill-after=20 "$limit" $cmd 2>&1 | tee "$LOGS/$name.log"
  rc=${PIPESTATUS[0]}
  SECONDS_TAKEN[$name]=$(( $(date +%s) - t0 ))
  case $rc in
    0) STATUS[$name]="passed" ;;
    124) STATUS[$name]="TIMED OUT after ${limit} s" ;;
    *) STATUS[$name]="FAILED (exit $rc)" ;;
  esac
done

echo
echo "=== gpu_check summary ($(( $(date +%s) - START )) s in all; logs in $LOGS)"
"$PY" -c "import torch; print(f'GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}')"
echo "tests: ${STATUS[tests]} in ${SECONDS_TAKEN[tests]} s — $(grep -E '(passed|failed|error)' "$LOGS/tests.log" | tail -n 1)"
echo "bench: ${STATUS[bench]} in ${SECONDS_TAKEN[bench]} s"
grep '^bench_gpu: ' "$LOGS/bench.log" | sed 's/^/  /'
for name in tests bench; do
  [ "${STATUS[$name]}" = "passed" ] || exit 1
done
