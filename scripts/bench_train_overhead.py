"""Loop overhead: train.py's real loop vs the bare model step (fwd + bwd + clip + AdamW) at the same shapes.

    python scripts/bench_train_overhead.py [--steps 60] [--threads 2] [overrides ...]

Both run in this process, bare step measured before and after the loop (drift cancels). The loop's
tokens/s comes from its own metrics.jsonl rows, which exclude eval and checkpoint time.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import OmegaConf, open_dict  # noqa: E402

import train as train_module  # noqa: E402
from model import Transformer  # noqa: E402
from training import distributed as D  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.optim import build_optimizer  # noqa: E402


def typed_config(overrides):
    train_module.register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        plain = OmegaConf.to_container(cfg, resolve=True)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), plain)), plain


def bare_step_tps(cfg: TrainConfig, steps: int) -> float:
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    opt = build_optimizer(model, cfg.optim, "cpu")
    b, t = cfg.trainer.micro_batch_size, cfg.trainer.seq_len
    x = torch.randint(0, cfg.model.vocab_size, (b, t))
    y = torch.randint(0, cfg.model.vocab_size, (b, t))
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return b * t / statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["logger=none", f"trainer.max_steps={args.steps}", "trainer.log_interval=10",
                     f"trainer.eval_interval={args.steps}", f"trainer.ckpt_interval={args.steps}",
                     "trainer.eval_windows=4", *args.overrides]
        cfg, plain = typed_config(overrides)
        before = bare_step_tps(cfg, 15)
        run = train_module.Run(cfg, Path(tmp) / "run", OmegaConf.to_yaml(plain), None)
        train_module.train(run, D.DistInfo())
        rows = [json.loads(l) for l in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
        loop = statistics.median(r["tokens_per_s"] for r in rows if r["kind"] == "train" and r["step"] > 10)
        after = bare_step_tps(cfg, 15)
    bare = (before + after) / 2
    print(f"\nshapes: batch {cfg.trainer.micro_batch_size} × seq {cfg.trainer.seq_len}, hidden {cfg.model.hidden_size}, "
          f"{cfg.model.n_layers} layers, {cfg.trainer.precision}, {args.threads} threads")
    print("| bare model step (before/after) | train.py loop | overhead |\n|---|---|---|")
    print(f"| {before:,.0f} / {after:,.0f} tok/s | {loop:,.0f} tok/s | {100 * (bare / loop - 1):+.1f} % |")


if __name__ == "__main__":
    main()
