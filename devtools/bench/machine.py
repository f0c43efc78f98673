"""What a start decides about the machine, start after start: `trainer.precision=auto`'s choice and the MFU peak,
each in a fresh process, with or without other processes keeping the cores busy.

Usage: python scripts/bench_machine.py [--starts 8] [--hogs 2] [--isa AVX2] [--threads 2] [--kept FILE]
Each start is a new Python process (as each `python train.py` is) that reports the CPU class, the precision
`auto` chooses for the default model's matmuls, and the peak in bf16 and fp32: the one a run uses (the best
kept so far, trainer.peak_cache, in a record fresh for this benchmark), this start's own measurement (many
short trials over several sizes) and the method before it (best of 8 at 2048³), for comparison.
--hogs N runs N busy loops beside the starts (at normal priority: other sessions' work is not niced).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cli import REPO

CHILD = r"""
import json, time, torch
torch.set_num_threads({threads})
from cli.config import compose_train_config
from training.build import run_matmul_shapes
from training.precision import resolve_precision
from training.runtime.cpu import cpu_class
from training.runtime import mfu
cfg, _ = compose_train_config([])
t0 = time.perf_counter()
precision, why = resolve_precision("auto", torch.device("cpu"), run_matmul_shapes(cfg))
decide_s = time.perf_counter() - t0
out = dict(cls=cpu_class().name, precision=precision, why=why, decide_s=decide_s)
for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
    if name == "bf16" and not cpu_class().bf16_in_hardware:
        continue  # emulated: seconds per 2048³ matmul, and no one's peak
    t0 = time.perf_counter()
    out[name] = mfu.measure_matmul_flops(torch.device("cpu"), dtype)
    out[name + "_s"] = time.perf_counter() - t0
    out[name + "_kept"] = mfu.peak_flops(torch.device("cpu"), name, kept_in={kept!r})[0]  # what a run uses
    a, b = (torch.randn(2048, 2048).to(dtype) for _ in range(2))
    a @ b
    times = []
    for _ in range(8):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    out[name + "_old"] = 2 * 2048 ** 3 / min(times)
print("RESULT " + json.dumps(out))
"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="The precision auto chooses and the MFU peak, measured in fresh "
                                            "processes, with busy processes beside them or not.")
    p.add_argument("--starts", type=int, default=8, help="fresh processes to start, one after another")
    p.add_argument("--hogs", type=int, default=0, help="busy loops to run beside the starts")
    p.add_argument("--isa", default=None, help="ONEDNN_MAX_CPU_ISA for the starts (emulate a lower CPU class)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kept", type=Path, default=None, help="the peak record the starts share (trainer.peak_cache); "
                                                           "default: a fresh one for this benchmark")
    return p.parse_args(argv)


def start(args, kept: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if args.isa:
        env["ONEDNN_MAX_CPU_ISA"] = args.isa
    done = subprocess.run([sys.executable, "-c", CHILD.format(threads=args.threads, kept=kept)], env=env, cwd=REPO,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def main(argv=None) -> None:
    args = parse_args(argv)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        time.sleep(0.5 if hogs else 0)
        with tempfile.TemporaryDirectory() as tmp:  # a fresh record unless --kept: the first start keeps its own
            kept = str(args.kept or Path(tmp) / "peaks.json")
            results = [start(args, kept) for _ in range(args.starts)]
    finally:
        for hog in hogs:
            hog.kill()
    print(f"{args.starts} starts, {args.hogs} busy loops beside them, {args.threads} threads"
          + (f", ONEDNN_MAX_CPU_ISA={args.isa}" if args.isa else "") + f"; CPU class {results[0]['cls']}\n")
    keys = ("bf16_kept", "bf16", "bf16_old", "fp32_kept", "fp32", "fp32_old")
    print("| start | precision | bf16 speed-up measured | decided in | bf16 peak a run uses (TFLOP/s) | this start's "
          "measurement | old method | fp32 peak a run uses | this start's | old method |\n"
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(results):
        speed = r["why"].split("measured ")[1].split(" on ")[0]
        cells = [f"{r[k] / 1e12:.3f}" if k in r else "–" for k in keys]
        print(f"| {i + 1} | {r['precision']} | {speed} | {r['decide_s']:.2f} s | " + " | ".join(cells) + " |")
    print()
    for key in keys:
        values = [r[key] for r in results[1:] if key in r]  # the first start has nothing kept yet
        if values:
            spread = (max(values) - min(values)) / statistics.median(values)
            print(f"{key} (starts 2–{len(results)}): {min(values) / 1e12:.3f}–{max(values) / 1e12:.3f} TFLOP/s, "
                  f"spread {spread:.0%} of the median")
    choices = {r["precision"] for r in results}
    print(f"precision: {', '.join(sorted(choices))} ({'the same every start' if len(choices) == 1 else 'FLIPPED'})")
