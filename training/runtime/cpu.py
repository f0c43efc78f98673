"""The CPU class: what this CPU reports for bf16 matmuls (AMX, AVX512-BF16 or neither), as torch sees the
hardware and as oneDNN — which runs CPU bf16 matmuls — is allowed to use it.

Three classes meet this code, 2–4× apart in speed and, for bf16, 40–100× apart: AMX and AVX512-BF16 run bf16
matmuls in hardware; an AVX2-only CPU has oneDNN emulate them. `ONEDNN_MAX_CPU_ISA` caps what oneDNN uses
(the suite emulates the lower classes with it, docs/testing.md), so the class is the hardware's, lowered to
the cap. This module reads that variable because oneDNN itself does, at its first matmul: it is a fact about
the process, like the CPU's flags, not a setting of minillama's.
"""
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

CLASSES = ("amx", "avx512_bf16", "avx2")  # best first
LABELS = {"amx": "AMX-bf16", "avx512_bf16": "AVX512-BF16", "avx2": "no AMX/AVX512-BF16"}
# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) → the highest class each allows; any cap below AVX512_CORE_BF16
# (AVX512_CORE, AVX2, SSE41, …) leaves bf16 emulated.
_CAPS = {"ALL": "amx", "DEFAULT": "amx", "AVX512_CORE_AMX": "amx", "AVX512_CORE_AMX_FP16": "amx",
         "AVX10_1_512_AMX": "amx", "AVX10_1_512_AMX_FP16": "amx", "AVX10_2_512_AMX_2": "amx",
         "AVX512_CORE_FP16": "avx512_bf16", "AVX10_1_512": "avx512_bf16", "AVX512_CORE_BF16": "avx512_bf16"}


@dataclass(frozen=True)
class CpuClass:
    name: str  # amx | avx512_bf16 | avx2: what oneDNN may use here for bf16 matmuls
    hardware: str  # the same, from the CPU's own flags alone
    cap: Optional[str]  # ONEDNN_MAX_CPU_ISA, when set
    model: str  # the CPU's model name

    @property
    def bf16_in_hardware(self) -> bool:
        return self.name != "avx2"

    @property
    def emulated(self) -> bool:
        """A class lowered by ONEDNN_MAX_CPU_ISA below what the hardware has."""
        return self.name != self.hardware

    def describe(self) -> str:
        """What the CPU reports, e.g. "CPU reports AMX-bf16" or "CPU reports AMX-bf16, capped to no
        AMX/AVX512-BF16 by ONEDNN_MAX_CPU_ISA=AVX2"."""
        said = f"CPU reports {LABELS[self.hardware]}"
        if self.emulated:
            said += f", capped to {LABELS[self.name]} by ONEDNN_MAX_CPU_ISA={self.cap}"
        return said


def cpu_class() -> CpuClass:
    hardware = _hardware_class()
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper() or None
    return CpuClass(name=lower(hardware, _CAPS.get(cap, "avx2") if cap else "amx"), hardware=hardware, cap=cap,
                    model=cpu_model())


def lower(a: str, b: str) -> str:
    """The lower of two classes."""
    return CLASSES[max(CLASSES.index(a), CLASSES.index(b))]


def _hardware_class() -> str:
    if not (platform.machine().lower() in ("x86_64", "amd64") and torch.cpu._is_avx2_supported()):
        return "avx2"  # Arm, or an x86 without AVX2: no oneDNN bf16 hardware path this code knows
    if torch.cpu._is_amx_tile_supported():
        return "amx"
    return "avx512_bf16" if torch.cpu._is_avx512_bf16_supported() else "avx2"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; platform's answer elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
