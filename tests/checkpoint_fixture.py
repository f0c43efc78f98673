"""A checkpoint of each format version, kept in tests/fixtures/ so that every later minillama must still load and
resume it (tests/test_checkpoint_format.py), and what the writer writes is compared against the current one.

A fixture is a real run directory written by `python train.py`: a one-layer `debug=tiny` model on Muon (the
default optimizer: its file holds a Muon and an AdamW state), stopped at step 2 of 3 as if interrupted. Its init is
wide (model.init_std=0.5) so that every part of the model moves the loss: at the default 0.02, two steps leave the
attention nearly uniform, and a checkpoint read with RoPE's rotation reversed scored within the tolerance. Beside it,
tests/fixtures/checkpoint_formats.json records what that checkpoint computes — its loss on fixed tokens, and the
loss of step 3 that the uninterrupted run trained — so a later reader that misreads it fails a test.

Make the fixture of a new format (after raising FORMAT_VERSION, training/checkpoint.py) and commit it
with the change; the older fixtures stay, untouched:

    .venv/bin/python -m tests.checkpoint_fixture      # from the repository's root
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
RECORD = FIXTURES / "checkpoint_formats.json"
STEP = 2  # the checkpoint's step; the run's end is STEP + 1
OVERRIDES = [
    "model.hidden_size=32",
    "model.n_layers=1",
    "model.init_std=0.5",
    "optim.name=muon",
    f"trainer.max_steps={STEP + 1}",
    "trainer.log_interval=1",
    "trainer.eval_interval=1000",
    "trainer.ckpt_interval=1000",
    "trainer.keep_best=false",
    "seed=7",
]
TOKENS = 33  # the fixed sequence the loss is read on: ids 0, 5, 10, … modulo the vocabulary


def fixture_dir(version: int) -> Path:
    return FIXTURES / f"checkpoint_format_{version}"


def checkpoint_of(run_dir: Path) -> Path:
    from training.checkpoint import RunFiles, checkpoint_name

    return RunFiles(run_dir).checkpoints / checkpoint_name(STEP)


def fixed_tokens_loss(ckpt: Path) -> float:
    """The checkpoint's model, loaded as generate.py loads it (verified), scored on TOKENS fixed ids in fp32."""
    import torch

    from training.checkpoint import load_model
    from training.loop import CausalLMLoss

    model, _, _ = load_model(str(ckpt))
    ids = (torch.arange(TOKENS) * 5 % model.cfg.vocab_size)[None]
    with torch.no_grad():
        return CausalLMLoss(model).eval()(ids[:, :-1], ids[:, 1:]).item()


def recorded() -> dict:
    """{version: what its fixture computes} from checkpoint_formats.json."""
    return {int(k): v for k, v in json.loads(RECORD.read_text()).items()} if RECORD.exists() else {}


def make(version: int, cache_dir: Path) -> dict:
    """Write fixture_dir(version) and return its record: train.py stopped at STEP, and the same run uninterrupted."""
    from tests.train_helpers import read_metrics, run_dirs, run_train

    with tempfile.TemporaryDirectory() as tmp:
        stopped, whole = Path(tmp) / "stopped", Path(tmp) / "whole"
        run_train(stopped, *OVERRIDES, f"trainer.stop_at_step={STEP}", cache_dir=cache_dir)
        run_train(whole, *OVERRIDES, cache_dir=cache_dir)
        (run,), (uninterrupted,) = run_dirs(stopped), run_dirs(whole)
        target = fixture_dir(version)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(run, target, ignore=shutil.ignore_patterns(".*"))  # not the live process's claim
        next_loss = next(
            row["loss"] for row in read_metrics(uninterrupted) if row.get("step") == STEP + 1 and "loss" in row
        )
    return {
        "overrides": OVERRIDES,
        "step": STEP,
        "fixed_tokens_loss": fixed_tokens_loss(checkpoint_of(target)),
        "next_step_loss": next_loss,
    }


def main() -> None:
    from training.checkpoint import FORMAT_VERSION

    records = recorded()
    if fixture_dir(FORMAT_VERSION).exists() and FORMAT_VERSION in records:
        sys.exit(
            f"error: {fixture_dir(FORMAT_VERSION)} exists: a format's fixture is written once; raise "
            "FORMAT_VERSION for a new format, or delete it (and its record) to write it again"
        )
    with tempfile.TemporaryDirectory() as cache:
        records[FORMAT_VERSION] = make(FORMAT_VERSION, Path(cache))
    RECORD.write_text(json.dumps({str(k): v for k, v in sorted(records.items())}, indent=2) + "\n")
    print(f"wrote {fixture_dir(FORMAT_VERSION)} and its record in {RECORD}")


if __name__ == "__main__":
    main()
