"""The golden loss curves: per-step training losses of two short fp32 `debug=tiny` runs, committed
in tests/golden/loss_curves.json and reproduced by tests/test_golden_curve.py.

After an intended change to the numbers (init, data order, the model's maths), re-bless them with
one command and commit the diff with the change that caused it:

    .venv/bin/python tests/golden_curve.py
"""
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "loss_curves.json"
STEPS = 30
VARIANTS = {  # the default recipe and one other norm and MLP
    "rmsnorm_swiglu": [],
    "layernorm_gelu": ["model.norm=layernorm", "model.mlp=gelu"],
}
COMMON = [f"trainer.max_steps={STEPS}", "trainer.log_interval=1", "trainer.precision=fp32", "trainer.eval_interval=1000",
          "trainer.ckpt_interval=1000", "trainer.keep_best=false", "model.dropout=0.0"]


def loss_curve(variant: str, cache_dir: Path, work_dir: Path) -> list:
    """The per-step training losses of `python train.py debug=tiny <COMMON> <variant>`, run in this process."""
    sys.path.insert(0, str(REPO))
    from tests.train_helpers import read_metrics, train_in_process
    run_dir = work_dir / variant
    train_in_process(run_dir, *COMMON, *VARIANTS[variant], cache_dir=cache_dir)
    return [row["loss"] for row in read_metrics(run_dir) if row.get("kind") == "train"]


def bless() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        curves = {v: loss_curve(v, Path(tmp) / "cache", Path(tmp) / "runs") for v in VARIANTS}
    import torch
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"torch": torch.__version__, "steps": STEPS, "overrides": COMMON,
                                  "variants": VARIANTS, "losses": curves}, indent=1) + "\n")
    print(f"wrote {GOLDEN}: " + ", ".join(f"{v} {c[0]:.4f} → {c[-1]:.4f}" for v, c in curves.items()))


if __name__ == "__main__":
    bless()
