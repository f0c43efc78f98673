"""torch.compile where it works: deciding `trainer.compile=auto`, a wrapper that falls back to eager
when compilation fails, and keeps a short last batch on the compiled graph instead of recompiling, and
inductor's on-disk cache kept apart per CPU instruction set."""
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Tuple, Union

import torch

from training.loss import IGNORE_INDEX


CACHE_TAG = "aten-"  # inductor's cache: one folder per ATen CPU capability (cache_for_this_cpu)


def cache_for_this_cpu() -> Path:
    """Points inductor's on-disk cache (under TORCHINDUCTOR_CACHE_DIR, else inductor's default in /tmp) at a
    folder of its own for the vector instruction set ATen and inductor use here, and returns that folder.

    torch 2.13's FX-graph cache key leaves that instruction set out. On an AVX-512 machine, the default run
    compiled under ATEN_CPU_CAPABILITY=avx2 (the documented AVX2 emulation), then run plainly on the same
    cache, corrupted the heap at its first step ("malloc(): unaligned tcache chunk detected", exit 134); the
    other way round, its first step was non-finite. Idempotent; a child process with another capability moves
    to a folder beside its parent's. Called before anything compiles (resolve_compile, CompiledLoss)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    current = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()).absolute()
    root = current.parent if current.name.startswith(CACHE_TAG) else current
    folder = root / f"{CACHE_TAG}{torch.backends.cpu.get_cpu_capability().lower()}"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    return folder


def resolve_compile(requested: Union[str, bool], device: torch.device) -> Tuple[bool, str]:
    """(compile?, why). `auto`: on for CUDA, and for CPU when inductor's C++ toolchain works."""
    cache_for_this_cpu()  # before the toolchain probe compiles anything
    choice = str(requested).lower()
    if choice not in ("auto", "true", "false"):
        raise ValueError(f"trainer.compile={requested!r} is unknown; choose auto, true or false")
    if choice != "auto":
        return choice == "true", f"trainer.compile={choice}"
    if not torch._dynamo.is_dynamo_supported():
        return False, f"torch.compile does not support Python {sys.version_info.major}.{sys.version_info.minor}"
    if device.type == "cuda":
        from torch.utils._triton import has_triton
        if not has_triton():
            return False, "CUDA without Triton: inductor cannot generate GPU kernels here"
        return True, "CUDA: inductor with Triton kernels"
    if device.type == "cpu":
        ok, why = cpu_toolchain_works()
        return ok, why
    return False, f"torch.compile is not used on {device.type} (inductor support there is incomplete)"


_TOOLCHAIN: Optional[Tuple[bool, str]] = None


def cpu_toolchain_works() -> Tuple[bool, str]:
    """(works?, why), by compiling and running one tiny function with inductor — the only honest check
    (a compiler binary can exist without OpenMP or torch's headers). ~1 s with a warm inductor cache,
    and it imports what the real compile needs anyway. Cached for the process."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None:
        try:
            probe = torch.compile(_probe, backend="inductor", fullgraph=True)
            x = torch.arange(8, dtype=torch.float32)
            ok = torch.equal(probe(x), _probe(x))
            _TOOLCHAIN = (ok, "CPU: inductor's C++ toolchain works") if ok else (
                False, "CPU: inductor's test kernel gave a wrong result")
        except Exception as e:  # any failure here means "don't compile", with the reason
            _TOOLCHAIN = (False, f"CPU: inductor's C++ toolchain failed ({_one_line(e)})")
    return _TOOLCHAIN


def _probe(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2.0 - 3.0).cumsum(0)


class CompiledLoss:
    """Calls `torch.compile(loss_module)`; on a compile failure warns once and runs eager from then on.

    Compilation is lazy: it happens at the first call in each mode (training; no_grad evaluation),
    so that is where it can fail. Other errors (a shape mismatch, out of memory) are raised as
    they are. A batch smaller than the largest seen (the last, partial eval batch) is padded with
    ignored targets: the mean loss over scored targets is unchanged and the compiled graph is
    reused, instead of a recompile with dynamic shapes (~30 s on CPU for the default model).
    Attribute access (train(), eval(), no_sync(), parameters()) reaches the wrapped module.
    """

    def __init__(self, module: torch.nn.Module, warn: Callable[[str], None] = None, **compile_kwargs):
        self.module = module
        self.warn = warn or (lambda message: print(message, file=sys.stderr))
        self.batch_size = 0
        self.compile_seconds = 0.0  # time of the calls that compiled (first call of each mode)
        self.failed: Optional[str] = None
        self._modes_seen = set()
        cache_for_this_cpu()
        try:
            self.compiled = torch.compile(module, **compile_kwargs)
        except Exception as e:  # e.g. an unknown backend: fail the same way as a failing first call
            self._fall_back(e)

    def __call__(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        input_ids, targets = self._pad(input_ids, targets)
        if self.failed is not None:
            return self.module(input_ids, targets)
        mode = (torch.is_grad_enabled(), self.module.training)
        start = time.perf_counter()
        try:
            with _backward_compiled_now():
                out = self.compiled(input_ids, targets)
        except _COMPILE_ERRORS as e:
            self._fall_back(e)
            return self.module(input_ids, targets)
        if mode not in self._modes_seen:
            self._modes_seen.add(mode)
            self.compile_seconds += time.perf_counter() - start
        return out

    def __getattr__(self, name):  # only reached for names this wrapper does not define
        if "module" not in self.__dict__:  # mid-construction or copy: nothing to delegate to yet
            raise AttributeError(name)
        return getattr(self.__dict__["module"], name)

    def _pad(self, input_ids: torch.Tensor, targets: torch.Tensor):
        n = input_ids.shape[0]
        self.batch_size = max(self.batch_size, n)
        if n == self.batch_size or self.failed is not None:
            return input_ids, targets
        pad = self.batch_size - n
        input_ids = torch.cat([input_ids, input_ids[:1].expand(pad, -1)])  # any valid ids: never scored
        targets = torch.cat([targets, targets.new_full((pad, targets.shape[1]), IGNORE_INDEX)])
        return input_ids, targets

    def _fall_back(self, error: Exception) -> None:
        self.failed = _one_line(error)
        self.warn(f"warning: torch.compile failed ({self.failed}); continuing without compile "
                  "(set trainer.compile=false to skip the attempt)")


_COMPILE_ERRORS = (torch._dynamo.exc.TorchDynamoException,)


def _backward_compiled_now():
    """AOTAutograd compiles the backward graph lazily, at the first loss.backward() — outside this
    wrapper, where a failure would crash the step. This flag (torch >= 2.6) compiles it during the
    forward call instead, so a backward that cannot compile falls back too, and the first call's time
    is the whole compile."""
    config = torch._functorch.config
    if not hasattr(config, "force_non_lazy_backward_lowering"):
        return contextlib.nullcontext()
    return config.patch(force_non_lazy_backward_lowering=True)


def _one_line(error: Exception) -> str:
    # BackendCompilerFailed's own first line names only the backend: report what it wraps.
    error = getattr(error, "inner_exception", None) or error
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__
