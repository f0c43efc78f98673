"""Benchmark the data pipeline: cold Shakespeare preparation (tokenizer training included), its
phases, a cache hit, and batch loading next to a training step of the default CPU model; then a
--corpus-mb MB local corpus of JSON lines with each encoder (dev/bench/corpus.py).

Usage: python -m dev.bench data [--repeats 3] [--no-model] [--corpus-mb 30] [--write]
  --write replaces the "## Data pipeline" section of BENCHMARKS.md with the results.
"""

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from data import DataConfig, TrainBatches, eval_windows, prepare
from data.cache import fast_encoder, fast_ids
from data.sources import load_plays
from data.tokenizer import train_tokenizer
from dev.bench.benchmarks_doc import write_section
from dev.bench.corpus import big_corpus, limited_prepare, measure_corpus, report_corpus
from training.cli import REPO, description

HEADING = "## Data pipeline (dev/bench/data.py)"
# Run from the repository root: `python -c` puts the working directory first on sys.path.
COLD_RUN = "from data import DataConfig, prepare\nprepare(DataConfig(cache_dir={cache!r}), log=lambda message: None)\n"


def cold_prepare_seconds() -> float:
    """Wall time of a fresh `python` that imports `data` and prepares Shakespeare into an empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", COLD_RUN.format(cache=cache)], cwd=REPO, check=True, capture_output=True)
        return time.perf_counter() - start


def timed(function, repeats: int) -> float:
    """Median seconds of `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def model_step_seconds(batch, repeats: int = 3) -> tuple:
    """(seconds, precision) of forward + backward of the default CPU model (configs/model/cpu.yaml
    sizes) on one micro batch, in the precision `trainer.precision=auto` picks on this machine."""
    import torch

    from model import ModelConfig, Transformer
    from training.loop import CausalLMLoss, autocast_context, resolve_precision

    model = Transformer(
        ModelConfig(vocab_size=4096, hidden_size=256, n_layers=6, n_heads=4, multiple_of=32, max_seq_len=256)
    )
    loss_fn, inputs, targets = CausalLMLoss(model), *batch
    precision, _ = resolve_precision("auto", torch.device("cpu"))
    autocast = autocast_context(precision, torch.device("cpu"))

    def step():
        with autocast():
            loss = loss_fn(inputs, targets)
        loss.backward()

    step()  # warm-up
    return timed(step, repeats), precision


def measure(repeats: int, with_model: bool) -> dict:
    from training.distributed import cpu_bf16

    results = {"cores": os.cpu_count(), "load": os.getloadavg()[0], "cpu": cpu_bf16()[1]}
    results["cold"] = statistics.median(cold_prepare_seconds() for _ in range(repeats))
    results["clean"] = timed(load_plays, repeats)
    texts = [play["text"] for play in load_plays()]
    results["megabytes"] = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    results["train_tokenizer"] = timed(lambda: train_tokenizer([texts], 4096), repeats)
    tokenizer = train_tokenizer([texts], 4096)
    results["encode"] = timed(lambda: tokenizer.encode_batch(texts), repeats)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(f"{tmp}/tokenizer.json")
        fast, _ = fast_encoder(f"{tmp}/tokenizer.json")
    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:  # as the writer calls it
        results["encode_fast"] = timed(lambda: list(pool.map(functools.partial(fast_ids, fast), texts)), repeats)
    with tempfile.TemporaryDirectory() as cache:
        prepared = prepare(DataConfig(cache_dir=cache), log=lambda message: None)
        results["cache_hit"] = timed(lambda: prepare(DataConfig(cache_dir=cache), log=lambda message: None), 20)
        results["tokens"] = prepared.meta["train_tokens"] + prepared.meta["val_tokens"]
        batches = TrainBatches(prepared.train_tokens(), seq_len=256, micro_batch_size=16, seed=0)
        steps = iter(range(10**9))
        results["get_16x256"] = timed(lambda: batches.get(next(steps)), 1000)
        big = TrainBatches(prepared.train_tokens(), seq_len=1024, micro_batch_size=32, seed=0)
        results["get_32x1024"] = timed(lambda: big.get(next(steps)), 200)
        results["eval_64x256"] = timed(lambda: eval_windows(prepared.val_tokens(), 256, 64), 20)
        if with_model:
            results["model_step"], results["precision"] = model_step_seconds(batches.get(0))
    return results


def report(r: dict) -> str:
    mb = r["megabytes"]
    lines = [
        f"`python -m dev.bench data --repeats 3 --write` on {r['cores']} CPU cores, class {r['cpu']}, "
        f"{time.strftime('%Y-%m-%d')} "
        f"(1-minute load average {r['load']:.1f} when it ran); medians.",
        "",
        "| what | time | throughput |",
        "|---|---|---|",
        f"| cold prepare, full Shakespeare ({mb:.2f} MB, {r['tokens']:,} tokens), fresh process "
        f"| {r['cold']:.2f} s | {mb / r['cold']:.2f} MB/s end to end |",
        f"| - markdown -> plain text, 38 plays | {r['clean'] * 1e3:.0f} ms | {mb / r['clean']:.1f} MB/s |",
        f"| - BPE training, vocab 4096 | {r['train_tokenizer']:.2f} s | {mb / r['train_tokenizer']:.1f} MB/s |",
        f"| - `encode_batch` of all plays (`tokenizers`) | {r['encode']:.2f} s | {mb / r['encode']:.1f} MB/s |",
        f"| - the same with tiktoken (data/cache.py, the same ids) | {r['encode_fast']:.2f} s | "
        f"{mb / r['encode_fast']:.1f} MB/s |",
        f"| cache hit (`prepare` again) | {r['cache_hit'] * 1e3:.1f} ms | |",
        f"| `TrainBatches.get`, 16 x 256 from the memmap | {r['get_16x256'] * 1e6:.0f} µs | |",
        f"| `TrainBatches.get`, 32 x 1024 | {r['get_32x1024'] * 1e6:.0f} µs | |",
        f"| `eval_windows`, 64 x 256 | {r['eval_64x256'] * 1e3:.2f} ms | once per run |",
    ]
    if "model_step" in r:
        share = r["get_16x256"] / r["model_step"] * 100
        lines.append(
            f"| forward + backward, default CPU model, 16 x 256 ({r['precision']}) "
            f"| {r['model_step'] * 1e3:.0f} ms | batch loading = {share:.3f}% of it |"
        )
    lines += [
        "",
        "The rest of a cold prepare is interpreter start-up and imports (`datasets` alone ~1 s), "
        "the tokenizer's training and the token files. Both encoders use every core: tiktoken one document per "
        "task in a thread pool (it releases the GIL while it encodes), `tokenizers` with rayon.",
        "",
    ]
    return "\n".join(lines)


BIG_HEADING = "## A corpus larger than memory (dev/bench/data.py --big-gb)"


def report_big(gigabytes: float, folder: Path) -> str:
    """The whole `scripts/prepare_data.py` command on a corpus of `gigabytes` GB under a memory limit of half that,
    as one JSON-lines file and as 16: a markdown table."""
    from training.distributed import cpu_bf16

    limit = int(gigabytes / 2 * 2**30)
    lines = [
        f"`python -m dev.bench data --big-gb {gigabytes:g}` on {os.cpu_count()} CPU cores ({cpu_bf16()[1]}), "
        f"{time.strftime('%Y-%m-%d')}: "
        f"{gigabytes:g} GB of Python source as JSON lines (dev/bench/corpus.py), vocab 8192, the whole command "
        f"`scripts/prepare_data.py` in a memory cgroup of {limit / 2**30:g} GiB, one run each.",
        "",
        "| files | exit | wall | MB/s, whole command | its own memory's peak (RssAnon) | peak RSS | the cgroup's peak |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for files in (1, 16):
        corpus = folder / f"{gigabytes:g}gb-{files}"
        size = big_corpus(corpus, gigabytes, files) if not corpus.exists() else gigabytes
        with tempfile.TemporaryDirectory(dir=folder) as cache:
            path = corpus / "part000.jsonl" if files == 1 else corpus / "*.jsonl"
            r = limited_prepare(str(path), limit, Path(cache) / "cache")
        lines.append(
            f"| {files} | {r['rc']} | {r['wall_s']:.0f} s | {size * 1e3 / r['wall_s']:.1f} | {r['peak_anon_mb']:.0f} MiB "
            f"| {r['peak_rss_mb']:.0f} MiB | {r['cgroup_peak_mb']:.0f} MiB |"
        )
    lines += [
        "",
        "RSS counts the pages of the corpus's Arrow copy the process maps, which are page cache the kernel drops under "
        "the limit; its own memory (RssAnon) is what stays flat. Sampled every 0.2 s.",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-model", action="store_true", help="skip the model step (batch loading alone)")
    parser.add_argument(
        "--corpus-mb", type=float, default=30.0, help="the local JSON-lines corpus's size in MB (0: skip it)"
    )
    parser.add_argument("--write", action="store_true", help="write the results into BENCHMARKS.md")
    parser.add_argument(
        "--big-gb",
        type=float,
        default=0,
        help="instead: prepare a corpus this big (GB) in a memory cgroup of half its size, as one file and as 16 "
        "(needs root; the corpus goes to --big-dir)",
    )
    parser.add_argument("--big-dir", default="/tmp/minillama-big-corpus")
    args = parser.parse_args(argv)
    if args.big_gb:
        body = report_big(args.big_gb, Path(args.big_dir))
        print(f"{BIG_HEADING}\n\n{body}")
        if args.write:
            write_section(REPO / "BENCHMARKS.md", BIG_HEADING, body)
        return
    body = report(measure(args.repeats, not args.no_model))
    if args.corpus_mb > 0:
        body += "\n".join(report_corpus(measure_corpus(args.corpus_mb, args.repeats)))
    print(f"{HEADING}\n\n{body}")
    if args.write:
        write_section(REPO / "BENCHMARKS.md", HEADING, body)
