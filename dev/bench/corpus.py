"""Benchmark preparing a big local corpus (issue 39's ≥ 30 MB of JSON lines): a cold `prepare` in a fresh process
with each encoder (tiktoken, the fast path, and `tokenizers`), its phases — the tokenizer's training apart —
and its peak memory at two corpus sizes, to show it stays flat as the corpus grows."""

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from training.cli import REPO

# A fresh interpreter prepares the corpus and prints what meta.json says and its peak memory. `tokenizers`
# alone: the fast encoder is switched off the way the tests switch it off.
CHILD = """
import json, re, sys, time
start = time.perf_counter()
import datasets  # timed apart: ~1 s of any prepare's process, whatever the corpus's size
import_s = time.perf_counter() - start
import data.cache
from data import DataConfig, prepare
if {encoder!r} == "tokenizers":
    data.cache.fast_encoder = lambda path: (None, "off")
real_write_split, encode_peak = data.cache.write_split, []

def status_kb(field):
    # VmHWM, this process's own peak: ru_maxrss would carry the parent's peak across exec. VmRSS: resident now.
    return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

def write_split(*args, **kwargs):
    if not encode_peak:  # the encoding phase's own peak: reset the high-water mark as it starts
        encode_peak.append(status_kb("VmHWM"))  # the peak before it: loading and the tokenizer's training
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # the mark drops to what is resident now, which earlier phases leave high
        encode_peak.append(status_kb("VmRSS"))
    return real_write_split(*args, **kwargs)

data.cache.write_split = write_split
start = time.perf_counter()
meta = prepare(DataConfig(source="local", path={corpus!r}, vocab_size=8192, cache_dir={cache!r}),
               log=lambda message: None).meta
wall_s = time.perf_counter() - start
print(json.dumps({{**meta, "wall_s": wall_s, "import_s": import_s, "encode_start_mb": encode_peak[1] / 1024,
                  "encode_peak_mb": status_kb("VmHWM") / 1024,
                  "peak_rss_mb": max(encode_peak[0], status_kb("VmHWM")) / 1024}}))
"""


def python_corpus(path: Path, megabytes: float) -> float:
    """A JSON-lines corpus of Python source, one module a line: the installed packages' .py files in path
    order, up to `megabytes` (the pinned requirements make it the same corpus on every machine). Its MB."""
    root = Path(sys.prefix) / "lib"
    size, limit = 0, megabytes * 1e6
    with open(path, "w") as out:
        for source in sorted(root.rglob("*.py")):
            try:
                text = source.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            out.write(json.dumps({"text": text}) + "\n")
            size += len(text.encode("utf-8"))
            if size >= limit:
                break
    return size / 1e6


def cold_prepare(corpus: Path, encoder: str) -> dict:
    """meta.json of a fresh process's prepare, with its wall seconds and peak resident memory."""
    with tempfile.TemporaryDirectory() as cache:
        code = CHILD.format(encoder=encoder, corpus=str(corpus), cache=cache)
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True)
        return json.loads(done.stdout.strip().splitlines()[-1])


def measure_corpus(megabytes: float, repeats: int) -> dict:
    """{(encoder, size): the median run's meta} at `megabytes` and a third of it."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, mb in (("small", megabytes / 3), ("big", megabytes)):
            corpus = Path(tmp) / f"{label}.jsonl"
            python_corpus(corpus, mb)
            for encoder in ("tiktoken", "tokenizers"):
                if encoder == "tokenizers" and label == "small":
                    continue  # the memory comparison is the fast path's
                runs = sorted((cold_prepare(corpus, encoder) for _ in range(repeats)), key=lambda m: m["wall_s"])
                results[(encoder, label)] = runs[len(runs) // 2]
    return results


def report_corpus(results: dict) -> list:
    """BENCHMARKS.md lines: throughput end to end and without the tokenizer's training, peak memory overall and
    the encoding phase's own, and the rate once started (between the two tiktoken corpora)."""

    def mb(meta):
        return (meta["train_bytes"] + meta["val_bytes"]) / 1e6

    def rest(meta):  # prepare without the tokenizer's training
        return meta["prepare_seconds"] - meta["tokenizer_seconds"]

    lines = [
        "",
        "A local corpus of Python source as JSON lines (`--corpus-mb`: the installed packages' `.py` files, "
        "one module a line), vocab 8192, a fresh process each, medians:",
        "",
        "| encoder | corpus | `import datasets` | tokenizer training | encoding + writing | prepare, end to end | "
        "without the tokenizer's training | peak memory | encoding: resident at its start → its peak |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (encoder, label), meta in results.items():
        lines.append(
            f"| {encoder} | {mb(meta):.1f} MB | {meta['import_s']:.1f} s | {meta['tokenizer_seconds']:.1f} s | "
            f"{meta['encode_seconds']:.1f} s ({mb(meta) / meta['encode_seconds']:.1f} MB/s) | "
            f"{meta['wall_s']:.1f} s ({mb(meta) / meta['wall_s']:.1f} MB/s) | "
            f"{rest(meta):.1f} s (**{mb(meta) / rest(meta):.1f} MB/s**) | {meta['peak_rss_mb']:.0f} MB | "
            f"{meta['encode_start_mb']:.0f} → {meta['encode_peak_mb']:.0f} MB |"
        )
    small, big = results.get(("tiktoken", "small")), results.get(("tiktoken", "big"))
    if small and big:
        more = rest(big) - rest(small)
        rate = (
            f"**{(mb(big) - mb(small)) / more:.1f} MB/s**"
            if more > 0
            else "not measurable here (the bigger corpus took no longer)"
        )
        lines += [
            "",
            f"Each further MB of corpus, without the tokenizer's training (the tiktoken rows' difference): "
            f"{rate} once started.",
        ]
    lines += [
        "",
        '"End to end" is the `prepare` call: reading the files, the cache key, the tokenizer, encoding and '
        "writing; interpreter start-up and `import datasets` are not in it (the child imports `datasets` "
        "first and times it apart: its own column). Peak memory is the child's `VmHWM` (its resident set's "
        "high-water mark). For the encoding phase alone the mark is reset (`/proc/self/clear_refs`) as the first "
        "split starts encoding: a reset drops it to what is resident then (the earlier phases' memory, not all "
        "given back), so the phase's own cost is the rise from that start to its peak. Encoding holds at most two windows of 4 MB "
        "of text (`ENCODE_BYTES`) and their ids (4 bytes a token) in flight, so that phase stays flat as the "
        "corpus grows; what grows is the tokenizer's training (BPE's word counts), which reads at most "
        "`data.tokenizer_train_bytes` (100 MB) of the corpus.",
        "",
    ]
    return lines


# ---- a corpus larger than memory ---------------------------------------------------------------------------------

CGROUP_V2, CGROUP_V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")


def big_corpus(folder: Path, gigabytes: float, files: int) -> float:
    """`gigabytes` of Python source as JSON lines in `files` files: the installed packages' modules, passed over again
    (each pass's documents marked apart) until the size is reached. Its GB."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = sorted((Path(sys.prefix) / "lib").rglob("*.py"))
    limit, size, n = gigabytes * 1e9, 0, 0
    outs = [open(folder / f"part{i:03d}.jsonl", "w") for i in range(files)]
    try:
        for rerun in range(1000):
            for source in sources:
                try:
                    text = f"# pass {rerun}\n" + source.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                outs[n % files].write(json.dumps({"text": text}) + "\n")
                size, n = size + len(text.encode("utf-8")), n + 1
                if size >= limit:
                    return size / 1e9
    finally:
        for out in outs:
            out.close()
    return size / 1e9


def limited_prepare(corpus: str, limit_bytes: int, cache: Path, timeout_s: float = 3600) -> dict:
    """The whole command `scripts/prepare_data.py` on `corpus` in a fresh memory cgroup of `limit_bytes` (needs root):
    its exit code (None: killed at `timeout_s`), wall seconds, its peak RSS, its own memory's peak (RssAnon, sampled)
    and the cgroup's peak (page cache included)."""
    v2 = (CGROUP_V2 / "cgroup.controllers").exists() and not CGROUP_V1.is_dir()
    group = (CGROUP_V2 if v2 else CGROUP_V1) / f"minillama-bench-{os.getpid()}"
    group.mkdir()
    try:
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))
        command = [sys.executable, "scripts/prepare_data.py", "data=local", f"data.path={corpus}"]
        command += ["data.vocab_size=8192", f"data.cache_dir={cache}"]
        log = cache.parent / f"{cache.name}.log"
        start = time.perf_counter()
        with open(log, "w") as out:
            child = subprocess.Popen(
                command,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
            )
            anon = 0  # its own memory (RssAnon), sampled: RSS also counts the corpus's pages it maps, which are cache
            while not (done := os.wait4(child.pid, os.WNOHANG))[0]:  # wait4: this child's own peak
                with contextlib.suppress(OSError, AttributeError):
                    own = Path(f"/proc/{child.pid}/status").read_text()
                    anon = max(anon, int(re.search(r"RssAnon:\s+(\d+)", own).group(1)))
                if time.perf_counter() - start > timeout_s:
                    child.kill()
                time.sleep(0.2)
            _, status, usage = done
        wall, lines = time.perf_counter() - start, log.read_text(errors="replace").strip().splitlines()
        return {
            "rc": None if time.perf_counter() - start > timeout_s else os.waitstatus_to_exitcode(status),
            "wall_s": wall,
            "peak_rss_mb": usage.ru_maxrss / 1024,
            "peak_anon_mb": anon / 1024,
            "cgroup_peak_mb": int((group / ("memory.peak" if v2 else "memory.max_usage_in_bytes")).read_text()) / 2**20,
            "last_line": next((line for line in reversed(lines) if line.startswith(("time", "error"))), lines[-1:]),
        }
    finally:
        group.rmdir()
