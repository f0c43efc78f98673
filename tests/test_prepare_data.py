"""scripts/prepare_data.py and the encoder's speed-ups: no torch loaded, every core encodes, the cache unchanged."""

import os
import subprocess
import sys

import data.cache as cache
from data import DataConfig, prepare
from tests.data_helpers import QUIET, REPO, make_documents, write_local

# A fresh interpreter runs the whole command, then says which of the heavy modules it loaded.
NO_TORCH = """
import runpy, sys
sys.path.insert(0, "scripts")
sys.argv = ["scripts/prepare_data.py", *sys.argv[1:]]
try:
    runpy.run_path("scripts/prepare_data.py", run_name="__main__")
finally:
    print("LOADED", sorted(m for m in ("torch", "model.transformer", "training.checkpoint") if m in sys.modules))
"""


def test_prepare_data_imports_no_torch(tmp_path):
    """Preparing never touches a model: torch (~3 s of a 2-core machine) stays out, built or found in the cache."""
    corpus = write_local(tmp_path / "in", make_documents(60), "jsonl")
    args = ["data=local", f"data.path={corpus}", "data.vocab_size=300", f"data.cache_dir={tmp_path / 'cache'}"]
    for run in ("built", "found"):
        proc = subprocess.run(
            [sys.executable, "-c", NO_TORCH, *args], cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        assert "LOADED []" in proc.stdout, (run, proc.stdout)
        assert ("cache hit" in proc.stdout) == (run == "found")


def test_the_cache_is_the_same_with_one_core_or_several(tmp_path, monkeypatch):
    """Windows are encoded by a pool as wide as the machine, written in order: one core or two, the same bytes."""
    corpus = write_local(tmp_path / "in", make_documents(400), "jsonl")
    monkeypatch.setattr(cache, "ENCODE_BYTES", 4096)  # many windows, several in flight
    metas = []
    for cores in (1, 2):
        monkeypatch.setattr(cache, "usable_cores", lambda cores=cores: cores)
        cfg = DataConfig(source="local", path=corpus, vocab_size=320, cache_dir=str(tmp_path / f"cache{cores}"))
        metas.append(prepare(cfg, **QUIET).meta)
    for split in ("train", "val"):
        assert metas[0][f"{split}_sha256"] == metas[1][f"{split}_sha256"]
        assert metas[0][f"{split}_tokens"] > 0


def test_usable_cores_follows_the_cgroup_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert cache.usable_cores(tmp_path) == affinity  # no cgroup files: the affinity
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    for quota, cores in (("-1", affinity), (f"{(affinity + 8) * 100000}", affinity), ("50000", 1)):  # cgroup v1
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        assert cache.usable_cores(tmp_path) == cores, quota
    (tmp_path / "cpu.max").write_text("max 100000\n")  # v2's file where it is, whatever v1's say: no quota
    assert cache.usable_cores(tmp_path) == affinity
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 cores' time: two threads
    assert cache.usable_cores(tmp_path) == min(2, affinity)


def test_the_cache_is_byte_for_byte_the_one_f8049f5_built(tmp_path):
    """The same corpus and settings give the very tokens f8049f5 wrote (cache version 4, digests taken there): no
    speed-up changed a byte."""
    corpus = write_local(tmp_path / "in", make_documents(400), "jsonl")
    cfg = DataConfig(source="local", path=corpus, vocab_size=320, cache_dir=str(tmp_path / "cache"))
    meta = prepare(cfg, **QUIET).meta
    assert meta["tokenizer_hash"] == "b7368304906b1660"
    assert meta["train_sha256"] == "0f398a2bf3060faa8eddde2b88d84215bbf617336c199bed648405372b70d3b1"
    assert meta["val_sha256"] == "586146c610280acf6303bfc0a38756a9e4606a4208d98b6d96b1918375145602"
