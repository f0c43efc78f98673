"""Loop overhead: train.py's real loop vs the bare step (loss, backward, clip, optimizer) at the same settings.

Both run in this process with the run's own precision and compile decision (auto: compiled where inductor works); the
bare step is timed for as many steps before and after the loop as the loop runs, so drift cancels. The loop's tokens/s
comes from its own metrics.jsonl rows, which exclude eval, checkpoint and compile time.
"""

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from data import prepare
from dev.bench import machine, timed
from model import Transformer
from training import distributed as D
from training.checkpoint import RunFiles
from training.log import read_metrics
from training.loop import (
    CausalLMLoss,
    CompiledLoss,
    RunSpec,
    autocast_context,
    resolve_compile,
    resolve_precision,
    train,
)
from training.optim import build_optimizers
from training.program import compose_run_config, description

LOG_INTERVAL = 10  # steps per metrics.jsonl row in the loop, and per timed block of the bare step


def bare_step_tps(cfg, steps: int) -> float:
    """Tokens/s of fwd + bwd + clip + optimizer on one fixed batch, compiled if the run would be."""
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    loss_module = CausalLMLoss(Transformer(cfg.model))
    optimizers = build_optimizers(loss_module, cfg.optim, "cpu")
    autocast = autocast_context(resolve_precision(cfg.trainer.precision, cpu)[0], cpu)
    compute = CompiledLoss(loss_module) if resolve_compile(cfg.trainer.compile, cpu)[0] else loss_module
    b, t = cfg.trainer.micro_batch_size, cfg.trainer.seq_len
    x, y = (torch.randint(0, cfg.model.vocab_size, (b, t)) for _ in range(2))

    def step():
        with autocast():
            loss = compute(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(loss_module.parameters(), cfg.optim.grad_clip)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(3):  # the first steps compile and warm up
        step()
    times = [timed(step) for _ in range(steps)]
    # The same statistic as the loop's: the median over blocks of LOG_INTERVAL steps of each block's
    # tokens/s (a median of single steps would drop the slow ones a 10-step row of metrics.jsonl keeps).
    blocks = [sum(times[i : i + LOG_INTERVAL]) for i in range(0, len(times) - LOG_INTERVAL + 1, LOG_INTERVAL)]
    return LOG_INTERVAL * b * t / statistics.median(blocks)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            "logger=none",
            f"trainer.max_steps={args.steps}",
            f"trainer.log_interval={LOG_INTERVAL}",
            f"trainer.eval_interval={args.steps}",
            f"trainer.ckpt_interval={args.steps}",
            "trainer.eval_windows=4",
            "trainer.sample_tokens=0",
            f"outputs_dir={tmp}",
            *args.overrides,
        ]
        cfg = compose_run_config(overrides)
        before = bare_step_tps(cfg, args.steps)
        data = prepare(cfg.data, seq_len=cfg.trainer.seq_len, model_vocab_size=cfg.model.vocab_size)
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        train(RunSpec(cfg, run_dir, OmegaConf.to_yaml(OmegaConf.structured(cfg))), D.DistInfo(), data)
        rows = read_metrics(RunFiles(run_dir).metrics)
        loop = statistics.median(r["tokens_per_s"] for r in rows if r["kind"] == "train" and r["step"] > 10)
        after = bare_step_tps(cfg, args.steps)
    bare = (before + after) / 2
    t = cfg.trainer
    print(
        f"\n{machine()}; batch {t.micro_batch_size} × seq {t.seq_len}, hidden {cfg.model.hidden_size}, "
        f"{cfg.model.depth}, precision={t.precision}, compile={t.compile}"
    )
    print("| bare step (before / after) | train.py loop | overhead |\n|---|---|---|")
    print(f"| {before:,.0f} / {after:,.0f} tok/s | {loop:,.0f} tok/s | {100 * (bare / loop - 1):+.1f} % |")
