"""The data benchmark: the whole `scripts/prepare_data.py` command on a corpus of Python source as JSON lines — side by
side with another checkout (--against), the tokenizer's sample against the compression it buys (--samples), and a
corpus larger than memory under a memory cgroup of half its size (--big-gb; needs root).

Usage: python -m dev.bench data [--corpus-mb 30] [--against DIR] [--samples 3,10,30] [--big-gb 2] [--corpus-dir D]
"""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from data.cache import usable_cores
from training.program import REPO, description

HEADING, BIG_HEADING = (
    "## Data pipeline (dev/bench/data.py)",
    "## A corpus larger than memory (dev/bench/data.py --big-gb)",
)


def python_corpus(folder: Path, megabytes: float) -> Path:
    """`megabytes` of Python source as JSON lines, one module a line: the installed packages' modules in path order (the
    same corpus wherever the requirements are), passed over again (each pass marked apart) until the size is reached."""
    folder.mkdir(parents=True, exist_ok=True)
    size = 0
    with open(folder / "part000.jsonl", "w") as out:
        for rerun in range(1000):
            for source in sorted((Path(sys.prefix) / "lib").rglob("*.py")):
                try:
                    text = (f"# pass {rerun}\n" if rerun else "") + source.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                out.write(json.dumps({"text": text}) + "\n")
                size += len(text.encode("utf-8"))
                if size >= megabytes * 1e6:
                    return folder / "part000.jsonl"
    raise ValueError(f"the installed packages hold less than {megabytes} MB of Python source 1000 times over")


def prepare_command(checkout: Path, corpus: Path, cache: Path, extra=(), memory_limit: int = 0) -> dict:
    """The whole command in `checkout`, a fresh process (in a memory cgroup of `memory_limit` bytes if given): its exit
    code, wall seconds, its own memory's peak (RssAnon, sampled every 0.1 s: RSS also counts the corpus's mapped Arrow
    pages, which are page cache), the cgroup's peak, and what meta.json says."""
    command = [sys.executable, "scripts/prepare_data.py", "data=local", f"data.path={corpus}", "data.vocab_size=8192"]
    v1 = Path("/sys/fs/cgroup/memory").is_dir()  # cgroup v1's memory hierarchy, else v2's unified one
    group = Path("/sys/fs/cgroup/memory" if v1 else "/sys/fs/cgroup") / f"minillama-bench-{os.getpid()}"
    if memory_limit:
        group.mkdir()
        (group / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(memory_limit))
    enter = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if memory_limit else None
    try:
        start, anon = time.perf_counter(), 0
        child = subprocess.Popen(
            [*command, f"data.cache_dir={cache}", *extra], cwd=checkout, stdout=subprocess.DEVNULL, preexec_fn=enter
        )
        while child.poll() is None:
            with contextlib.suppress(OSError, AttributeError):
                status = Path(f"/proc/{child.pid}/status").read_text()
                anon = max(anon, int(re.search(r"RssAnon:\s+(\d+)", status).group(1)))
            time.sleep(0.1)
        wall = time.perf_counter() - start
        peak = int((group / ("memory.max_usage_in_bytes" if v1 else "memory.peak")).read_text()) if memory_limit else 0
    finally:
        if memory_limit:
            group.rmdir()
    meta = next((json.loads(m.read_text()) for m in Path(cache).glob("local-*/meta.json")), {})
    return {"rc": child.returncode, "wall": wall, "anon_mb": anon / 1024, "cgroup_mb": peak / 2**20, **meta}


def megabytes(meta: dict) -> float:
    return (meta["train_bytes"] + meta["val_bytes"]) / 1e6


def side_by_side(corpus: Path, checkouts: list, tmp: Path) -> list:
    """Each checkout's command twice, alternating, into an empty cache; then once more into the full one (a hit)."""
    runs = {c: [] for c in checkouts}
    for attempt, c in [(a, c) for a in range(2) for c in checkouts]:
        runs[c].append(prepare_command(c, corpus, tmp / f"cache-{attempt}-{checkouts.index(c)}"))
    lines = ["| checkout | cold runs | faster | MB/s | tokenizer training | encoding | own memory's peak | cache hit |"]
    lines.append("|---|" + "---:|" * 7)
    for c in checkouts:
        best, hit = (
            min(runs[c], key=lambda r: r["wall"]),
            prepare_command(c, corpus, tmp / f"cache-1-{checkouts.index(c)}"),
        )
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=c, capture_output=True, text=True).stdout
        lines.append(
            f"| `{head.strip()}` | {' / '.join(format(r['wall'], '.1f') for r in runs[c])} s | **{best['wall']:.1f} s** "
            f"| {megabytes(best) / best['wall']:.1f} | {best['tokenizer_seconds']:.1f} s | {best['encode_seconds']:.1f} s "
            f"({megabytes(best) / best['encode_seconds']:.1f} MB/s) | {best['anon_mb']:.0f} MiB | {hit['wall']:.1f} s |"
        )
    return lines


def samples(corpus: Path, sizes: list, tmp: Path) -> list:
    """The held-out validation split's bytes/token with tokenizers trained on samples of `sizes` MB of the training
    split (data.tokenizer_train_bytes); the training split's encoding stops at once (data.token_budget)."""
    lines = ["| tokenizer's sample | validation bytes/token | vs the largest | its training |", "|" + "---:|" * 4]
    extra = [[f"data.tokenizer_train_bytes={int(mb * 1e6)}", "data.token_budget=1"] for mb in sizes]
    runs = [prepare_command(REPO, corpus, tmp / f"sample-{mb}", e) for mb, e in zip(sizes, extra)]
    for mb, r in zip(sizes, runs):
        ratio, best = r["val_bytes"] / r["val_tokens"], runs[-1]["val_bytes"] / runs[-1]["val_tokens"]
        lines.append(
            f"| {mb:g} MB | {ratio:.3f} | {(ratio / best - 1) * 100:+.1f} % | {r['tokenizer_seconds']:.1f} s |"
        )
    return lines


def big(corpus: Path, gigabytes: float, tmp: Path) -> list:
    """The command on `gigabytes` of JSON lines in a memory cgroup of half that."""
    r = prepare_command(REPO, corpus, tmp / "cache", memory_limit=int(gigabytes / 2 * 2**30))
    rate = f"{megabytes(r) / r['wall']:.1f}" if r["rc"] == 0 else "-"
    return [
        "| exit | wall | MB/s | cores | tokenizer training | encoding | own memory's peak | cgroup's peak |",
        "|" + "---:|" * 8,
        f"| {r['rc']} | {r['wall']:.0f} s | {rate} | {usable_cores()} | {r.get('tokenizer_seconds', 0):.0f} s | "
        f"{r.get('encode_seconds', 0):.0f} s | {r['anon_mb']:.0f} MiB | {r['cgroup_mb']:.0f} MiB |",
    ]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--corpus-mb", type=float, default=30.0)
    parser.add_argument("--against", type=Path, help="another checkout (a worktree) to run the command in as well")
    parser.add_argument(
        "--samples", default="", help="instead: tokenizer samples in MB, e.g. 3,10,30 (the last: the reference)"
    )
    parser.add_argument("--big-gb", type=float, default=0, help="instead: a corpus this big under half its memory")
    parser.add_argument("--corpus-dir", type=Path, default=Path("/tmp/minillama-bench-corpus"), help="kept for reruns")
    args = parser.parse_args(argv)
    corpus = args.corpus_dir / f"{(size := args.big_gb * 1e3 or args.corpus_mb):g}mb" / "part000.jsonl"
    corpus = corpus if corpus.exists() else python_corpus(corpus.parent, size)
    with tempfile.TemporaryDirectory(dir=args.corpus_dir) as tmp:
        if args.samples:
            lines = samples(corpus, [float(mb) for mb in args.samples.split(",")], Path(tmp))
        elif args.big_gb:
            lines = big(corpus, args.big_gb, Path(tmp))
        else:
            lines = side_by_side(corpus, [REPO, *([args.against] if args.against else [])], Path(tmp))
    heading = BIG_HEADING if args.big_gb and not args.samples else HEADING
    print(f"{heading}\n\n`python -m dev.bench data {' '.join(argv or sys.argv[1:])}`, {time.strftime('%Y-%m-%d')}\n")
    print("\n".join(lines))
