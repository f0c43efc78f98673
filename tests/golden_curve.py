"""The golden loss curves: per-step training losses of short `debug=tiny` runs, committed in
tests/golden/loss_curves.json and reproduced by tests/test_golden_curve.py.

Two fp32 curves (the default recipe and one other norm and MLP), and one bf16 curve per class of CPU
bf16 hardware. fp32 curves agree across CPUs to ~1e-6; bf16 ones do not: a bf16 matmul rounds its
output, and AMX, AVX512-BF16 and AVX2 (which emulates bf16) accumulate in different orders, so some
elements round the other way and the curves drift apart by 2-5e-3 in 30 steps — as far as bf16 is
from fp32. Hence one bf16 curve per class (`bf16_class`).

After an intended change to the numbers (init, data order, the model's maths), re-bless them and
commit the diff with the change that caused it:

    .venv/bin/python tests/golden_curve.py          # the fp32 curves and this machine's bf16 class
    .venv/bin/python tests/golden_curve.py --bf16-classes all   # also the other classes, emulated here

A class other than this machine's is emulated by capping the kernels' instruction sets
(oneDNN, ATen and MKL) — possible on an AMX machine, which runs all three.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "loss_curves.json"
STEPS = 30
VARIANTS = {  # the default recipe and one other norm and MLP, on random windows; and the default data order
    "rmsnorm_swiglu": ["data.sampling=random"],
    "layernorm_gelu": ["data.sampling=random", "model.norm=layernorm", "model.mlp=gelu"],
    "rmsnorm_swiglu_epochs": ["data.sampling=epochs"],  # fp32: one curve on every CPU, so no class to re-bless
}
BF16_VARIANT = ["data.sampling=random", "trainer.precision=bf16"]  # the default recipe under bf16 autocast
COMMON = [
    f"trainer.max_steps={STEPS}",
    "trainer.log_interval=1",
    "trainer.precision=fp32",
    "trainer.eval_interval=1000",
    "trainer.ckpt_interval=1000",
    "trainer.keep_best=false",
    "model.dropout=0.0",
]
# Instruction-set caps that make an AMX machine compute as each class does.
EMULATE = {
    "amx": {},
    "avx512_bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "ATEN_CPU_CAPABILITY": "avx512"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


CLASSES = ("amx", "avx512_bf16", "avx2")  # best first


def hardware_class() -> str:
    """amx | avx512_bf16 | avx2 from the CPU's own flags (an Arm CPU, or x86 without AVX2: avx2, no bf16 path)."""
    import platform

    import torch

    if not (platform.machine().lower() in ("x86_64", "amd64") and torch.cpu._is_avx2_supported()):
        return "avx2"
    return (
        "amx"
        if torch.cpu._is_amx_tile_supported()
        else "avx512_bf16"
        if torch.cpu._is_avx512_bf16_supported()
        else "avx2"
    )


def bf16_class() -> str:
    """amx | avx512_bf16 | avx2: the bf16 hardware oneDNN uses here (a cap set by EMULATE wins): the CPU class."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or "").upper()
    capped = next((cls for cls, env in EMULATE.items() if env and env["ONEDNN_MAX_CPU_ISA"] == cap), "amx")
    return CLASSES[max(CLASSES.index(hardware_class()), CLASSES.index(capped))]


def computes_as_its_class() -> bool:
    """Whether this process computes as a real CPU of its class does: oneDNN's ISA (the class) and ATen's kernels
    both the class's. `ONEDNN_MAX_CPU_ISA=AVX2` alone on an AVX-512 CPU leaves ATen's AVX-512 kernels, a mix no
    real CPU has: its bf16 curve moved 2.1e-3 nats from the AVX2 class's (recorded with EMULATE's full caps), on
    an AMD EPYC. Such a process checks its class's curve in a child with the full caps (test_cpu_classes.py)."""
    import torch

    want = EMULATE[bf16_class()].get("ATEN_CPU_CAPABILITY")
    return want is None or torch.backends.cpu.get_cpu_capability().lower() == want


def can_emulate(cls: str) -> bool:
    """Whether this machine can compute as `cls` does: a class at or below its hardware's (caps only lower)."""
    return CLASSES.index(hardware_class()) <= CLASSES.index(cls)


def overrides_of(variant_overrides: list) -> list:
    """COMMON with the variant's own values winning (Hydra refuses a key given twice)."""
    keys = {o.split("=")[0] for o in variant_overrides}
    return [o for o in COMMON if o.split("=")[0] not in keys] + list(variant_overrides)


def loss_curve(variant: str, cache_dir: Path, work_dir: Path) -> list:
    """The per-step training losses of `python train.py debug=tiny <COMMON> <variant>`, run in this process
    (`bf16` is the default recipe under bf16 autocast)."""
    sys.path.insert(0, str(REPO))
    from tests.train_helpers import read_metrics, train_in_process

    run_dir = work_dir / variant
    train_in_process(
        run_dir, *overrides_of(BF16_VARIANT if variant == "bf16" else VARIANTS[variant]), cache_dir=cache_dir
    )
    return [row["loss"] for row in read_metrics(run_dir) if row.get("kind") == "train"]


def bless(bf16_classes: list, fp32: bool = True) -> None:
    import torch

    old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        curves = (
            {v: loss_curve(v, Path(tmp) / "cache", Path(tmp) / "runs") for v in VARIANTS} if fp32 else old["losses"]
        )
        bf16 = dict(old.get("bf16_losses", {}))
        for cls in bf16_classes:
            if cls == bf16_class():
                bf16[cls] = loss_curve("bf16", Path(tmp) / "cache", Path(tmp) / "runs")
            else:  # another class: a child process with the instruction sets capped
                out = Path(tmp) / f"{cls}.json"
                subprocess.run(
                    [sys.executable, __file__, "--bf16-only", str(out)],
                    check=True,
                    env={**os.environ, **EMULATE[cls]},
                    cwd=REPO,
                )
                bf16[cls] = json.loads(out.read_text())
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(
        json.dumps(
            {
                "torch": torch.__version__,
                "steps": STEPS,
                "overrides": COMMON,
                "variants": VARIANTS,
                "losses": curves,
                "bf16_overrides": BF16_VARIANT,
                "bf16_losses": dict(sorted(bf16.items())),
            },
            indent=1,
        )
        + "\n"
    )
    print(
        f"wrote {GOLDEN}: "
        + ", ".join(f"{v} {c[0]:.4f} → {c[-1]:.4f}" for v, c in curves.items())
        + "; bf16 "
        + ", ".join(f"{k} → {c[-1]:.4f}" for k, c in bf16.items())
    )


def main() -> None:
    p = argparse.ArgumentParser(description="re-bless the golden loss curves")
    p.add_argument(
        "--bf16-classes", default="this", help="this | all | a comma-separated list of " + ", ".join(EMULATE)
    )
    p.add_argument("--no-fp32", action="store_true", help="keep the committed fp32 curves; bless only bf16")
    p.add_argument("--bf16-only", type=Path, help=argparse.SUPPRESS)  # internal: one bf16 curve into this file
    p.add_argument("--cache", type=Path, help=argparse.SUPPRESS)  # internal: a debug=tiny data cache to reuse
    args = p.parse_args()
    if args.bf16_only:
        with tempfile.TemporaryDirectory() as tmp:
            cache = args.cache or Path(tmp) / "cache"
            args.bf16_only.write_text(json.dumps(loss_curve("bf16", cache, Path(tmp) / "runs")))
        return
    classes = {"this": [bf16_class()], "all": list(EMULATE)}.get(args.bf16_classes, args.bf16_classes.split(","))
    bless(classes, fp32=not args.no_fp32)


if __name__ == "__main__":
    main()
