"""training/memory.py: the CPU peak follows a real allocation and can be reset; CUDA reads the allocator."""
import sys

import pytest
import torch

from training.runtime import memory

CPU = torch.device("cpu")
MB = 2 ** 20


def test_cpu_peak_grows_with_an_allocation_and_stays_after_it_is_freed():
    if not memory.reset_peak_memory(CPU):  # an earlier test's higher peak would hide this allocation
        pytest.skip("resetting the peak RSS needs Linux /proc")
    before = memory.peak_memory_bytes(CPU)
    block = torch.ones(200 * MB // 4)  # 200 MB, touched, so resident
    during = memory.peak_memory_bytes(CPU)
    del block
    assert during >= before + 150 * MB  # more than the page cache's noise
    assert memory.peak_memory_bytes(CPU) >= during  # a peak, not the current usage
    assert memory.current_memory_bytes(CPU) < during - 150 * MB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resetting the peak RSS needs Linux /proc")
def test_cpu_peak_resets_to_the_current_usage():
    block = torch.ones(200 * MB // 4)
    del block
    assert memory.reset_peak_memory(CPU)
    after_reset = memory.peak_memory_bytes(CPU)
    assert after_reset < memory.current_memory_bytes(CPU) + 50 * MB
    small = torch.ones(80 * MB // 4)
    assert memory.peak_memory_bytes(CPU) >= after_reset + 60 * MB
    del small


def test_cuda_reads_the_allocator(monkeypatch):
    # No GPU needed: what is read on CUDA is the allocator's peak, not the process RSS.
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 123)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: None)
    cuda = torch.device("cuda", 0)
    assert memory.peak_memory_bytes(cuda) == 123 and memory.reset_peak_memory(cuda)
    assert memory.memory_kind(cuda) == "CUDA max allocated" and memory.memory_kind(CPU) == "process max RSS"
