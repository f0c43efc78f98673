"""Train minillama: `python train.py [overrides]` — Hydra config in, checkpoints and metrics out."""
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import hydra
import torch
import torch.nn.functional as F
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data import TrainBatches, eval_windows, prepare
from model import Transformer
from training import distributed as D
from training import report
from training.checkpoint import load_training_state, read_weights, resolve_checkpoint, restore_rng, save_checkpoint
from training.config import TrainConfig
from training.evaluation import evaluate, sample_text
from training.mfu import peak_flops
from training.optim import apply_schedule, build_optimizers
from training.precision import autocast_context, resolve_precision
from training.run_logger import RunLogger
from training.signals import StopFlag


class ConfigError(ValueError):
    pass


class JobFailed(CompactHydraException):
    """A multirun job's one-line error: Hydra records it, runs the other jobs, then reports it."""


TOP_LEVEL_KEYS = ("seed", "run_name", "outputs_dir")


def register_configs() -> None:
    """Typed schema under the YAML: a typo'd key or a wrong type fails at composition."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


@dataclass
class Run:
    cfg: TrainConfig
    run_dir: Path
    config_yaml: str  # the resolved config, saved next to every checkpoint
    resume_ckpt: Optional[Path]
    multirun: bool = False  # one job of a `-m` sweep: a stop signal then ends the whole sweep


def resolve_run(dict_cfg: DictConfig, info: D.DistInfo) -> Run:
    """Typed config + run directory. A resume continues in the checkpoint's run directory with the
    saved config; command-line overrides (e.g. trainer.max_steps=…) still apply on top."""
    hydra_cfg = HydraConfig.get()
    resume_ckpt = None
    if dict_cfg.resume:
        resume_ckpt = resolve_checkpoint(dict_cfg.resume, dict_cfg.outputs_dir)
        run_dir = resume_ckpt.parent.parent
        overrides = [o.lstrip("+") for o in hydra_cfg.overrides.task if not o.startswith("resume=")]
        groups = [o for o in overrides if "." not in o.split("=")[0] and o.split("=")[0] not in TOP_LEVEL_KEYS]
        if groups:  # the checkpoint's config already holds the composed groups
            print(f"resume: config groups come from the checkpoint; ignoring {' '.join(groups)}", file=sys.stderr)
        overrides = [o for o in overrides if o not in groups]
        saved = OmegaConf.load(resume_ckpt / "config.yaml")
        saved.trainer.stop_at_step = None  # an early stop applies to the run that stopped, not the resume
        dict_cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved, OmegaConf.from_dotlist(overrides))
        _discard_unused_dir(Path(hydra_cfg.runtime.output_dir))  # Hydra made a fresh dir we don't use
    else:
        run_dir = Path(hydra_cfg.runtime.output_dir)
        if (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists():
            raise ConfigError(f"run directory {run_dir} already holds a run; resume it with resume={run_dir} "
                              "or choose another hydra.run.dir")
    try:
        plain = OmegaConf.to_container(dict_cfg, resolve=True)
        plain.pop("hydra", None)
        plain["resume"] = None
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), plain))
    except OmegaConfBaseException as e:
        raise ConfigError(str(e).splitlines()[0])
    if info.world_size > 1:  # ranks may have started in different seconds: use rank 0's directory
        hydra_dir, run_dir = Path(hydra_cfg.runtime.output_dir), D.broadcast_object(run_dir, info)
        if hydra_dir != run_dir:
            _discard_unused_dir(hydra_dir)
    if cfg.trainer.seq_len > cfg.model.max_seq_len:
        raise ConfigError(f"trainer.seq_len={cfg.trainer.seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len}; "
                          "lower the first or raise the second")
    for key in ("max_steps", "micro_batch_size", "grad_accum_steps", "eval_interval", "log_interval",
                "ckpt_interval", "eval_windows"):
        if getattr(cfg.trainer, key) <= 0:
            raise ConfigError(f"trainer.{key}={getattr(cfg.trainer, key)} must be a positive integer")
    return Run(cfg, run_dir, OmegaConf.to_yaml(plain), resume_ckpt, hydra_cfg.mode == RunMode.MULTIRUN)


def _discard_unused_dir(path: Path) -> None:
    """Remove a Hydra output dir this process does not use, if it holds nothing but empty logs."""
    if not path.is_dir() or any(p.suffix != ".log" or p.stat().st_size for p in path.iterdir()):
        return
    for log in path.iterdir():
        log.unlink()
    path.rmdir()


def train_step(model, batches, step, cfg, optimizers, autocast, device):
    """One optimizer step over grad_accum_steps micro-batches; returns (mean loss, grad norm)."""
    accum = cfg.trainer.grad_accum_steps
    total = torch.zeros((), device=device)
    for micro in range(accum):
        x, y = (t.to(device, non_blocking=True) for t in batches.get(step, micro))
        # DDP all-reduces gradients only on the last micro-step instead of `accum` times.
        skip_sync = hasattr(model, "no_sync") and micro < accum - 1
        with model.no_sync() if skip_sync else contextlib.nullcontext():
            with autocast():
                logits = model(x)  # (B, T, vocab)
            # Cross-entropy in fp32: a bf16 log-softmax rounds away the probabilities of rare tokens.
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1)) / accum
            loss.backward()
        total += loss.detach()
    clip = cfg.optim.grad_clip
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return total, grad_norm


def train(run: Run, info: D.DistInfo) -> float:
    cfg, seq_len = run.cfg, run.cfg.trainer.seq_len
    say = print if info.is_main else (lambda *a, **k: None)
    torch.manual_seed(cfg.seed)
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    # ---- data: rank 0 builds the token cache, the other ranks then find it ready -----------------
    if info.is_main:
        data = prepare(cfg.data, seq_len=seq_len, model_vocab_size=cfg.model.vocab_size)
    D.barrier(info)
    if not info.is_main:
        data = prepare(cfg.data, seq_len=seq_len, model_vocab_size=cfg.model.vocab_size, log=lambda *a: None)
    batches = TrainBatches(data.train_tokens(), seq_len, cfg.trainer.micro_batch_size, cfg.seed,
                           info.rank, info.world_size)
    windows = eval_windows(data.val_tokens(), seq_len, cfg.trainer.eval_windows, info.rank, info.world_size)

    # ---- model and optimizer ---------------------------------------------------------------------
    raw_model = Transformer(cfg.model).to(info.device)
    parallel = D.resolve_parallel(cfg.trainer.parallel, info.world_size)
    precision, precision_why = resolve_precision(cfg.trainer.precision, info.device)
    model = D.wrap_model(raw_model, parallel, info, precision)
    optimizers = build_optimizers(model, cfg.optim, info.device.type)
    autocast = autocast_context(precision, info.device)
    start_step, tokens_seen, elapsed_before = 0, 0, 0.0
    if run.resume_ckpt is not None:
        state, optim_state, rng = load_training_state(run.resume_ckpt)
        D.load_full_state(model, optimizers, read_weights(raw_model, run.resume_ckpt), optim_state)
        restore_rng(rng)
        start_step, tokens_seen, elapsed_before = state["step"], state["tokens_seen"], state["elapsed_s"]
        if start_step >= cfg.trainer.max_steps:
            raise ConfigError(f"{run.resume_ckpt} is already at step {start_step} = trainer.max_steps; pass a larger "
                              "trainer.max_steps to train further (the cosine schedule then stretches to it)")
        if state.get("world_size", 1) != info.world_size:
            say(f"warning: resuming a {state['world_size']}-process run on {info.world_size}: each step's global "
                f"batch changes with the world size; adjust trainer.micro_batch_size to keep tokens per step")
    step_fn = torch.compile(model) if cfg.trainer.compile else model

    tokens_per_step = cfg.trainer.micro_batch_size * seq_len * cfg.trainer.grad_accum_steps * info.world_size
    flops_per_token = raw_model.flops_per_token(seq_len)
    peak, peak_source = peak_flops(info.device, precision, cfg.trainer.peak_tflops)
    counts = raw_model.param_counts()
    say(f"run dir: {run.run_dir}" + (f" (resuming {run.resume_ckpt})" if run.resume_ckpt else ""))
    say(f"model: {cfg.model.norm} + {cfg.model.mlp}, hidden_size {cfg.model.hidden_size}, intermediate_size "
        f"{cfg.model.intermediate_size}, {cfg.model.n_layers} layers, {counts['total'] / 1e6:.2f}M parameters "
        f"(embedding {counts['embedding'] / 1e6:.2f}M, attention {counts['attention'] / 1e6:.2f}M, "
        f"mlp {counts['mlp'] / 1e6:.2f}M, norm {counts['norm'] / 1e3:.1f}K)")
    say(f"data: {data.meta['source']}: {data.meta['train_tokens']:,} train / {data.meta['val_tokens']:,} val tokens, "
        f"vocab {data.meta['vocab_size']}, cache {data.dir}")
    say(f"tokens per optimizer step: {cfg.trainer.micro_batch_size} micro batch × {seq_len} seq_len × "
        f"{cfg.trainer.grad_accum_steps} accumulation × {info.world_size} processes = {tokens_per_step:,}")
    say(f"{info.device}, {precision} ({precision_why}), parallel={parallel}, compile={cfg.trainer.compile}, "
        f"peak {peak / 1e12:.2f} TFLOP/s ({peak_source}), steps {start_step}→{cfg.trainer.max_steps}")
    if info.is_main:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "config.yaml").write_text(run.config_yaml)
    log = RunLogger(run.run_dir, cfg.logger, cfg.run_name, OmegaConf.to_container(OmegaConf.create(run.config_yaml)),
                    info.is_main, resume_step=start_step if run.resume_ckpt else None)
    t0 = time.time()

    def save(step: int) -> Optional[Path]:
        model_state = D.full_model_state(model)  # collective under FSDP: every rank calls these
        optim_state = D.full_optimizer_state(model, optimizers)
        path = None
        if info.is_main:
            state = {"step": step, "tokens_seen": tokens_seen, "elapsed_s": elapsed_before + time.time() - t0,
                     "data_position": {"seed": cfg.seed, "next_step": step}, "world_size": info.world_size}
            path = save_checkpoint(run.run_dir / "checkpoints", step, model_state, cfg.model, data.tokenizer_path,
                                   state, run.config_yaml, optim_state, cfg.trainer.keep_last)
        D.barrier(info)
        return path

    # ---- loop ------------------------------------------------------------------------------------
    stop, step, last_eval, ckpt_path = StopFlag(), start_step, None, None
    progress = report.progress_bar(info.is_main, start_step, cfg.trainer.max_steps)
    pending, t_log = [], time.time()
    model.train()
    try:
        end = min(cfg.trainer.max_steps, cfg.trainer.stop_at_step or cfg.trainer.max_steps)
        while step < end and stop.signal is None:
            lr = apply_schedule(optimizers, step, cfg.optim, cfg.trainer.max_steps)
            loss, grad_norm = train_step(step_fn, batches, step, cfg, optimizers, autocast, info.device)
            step += 1
            tokens_seen += tokens_per_step
            pending.append((step, loss))
            progress.update(1)
            last = step == end
            if step % cfg.trainer.log_interval == 0 or last:
                # Mean over ranks, one host sync per interval (not per step).
                losses = D.all_reduce_mean(torch.stack([l for _, l in pending]), info).tolist()
                report.check_finite(list(zip([s for s, _ in pending], losses)), run.run_dir / "checkpoints")
                tps = len(pending) * tokens_per_step / (time.time() - t_log)
                row = {"kind": "train", "step": step, "loss": sum(losses) / len(losses),
                       "lr": lr, "grad_norm": grad_norm.item(), "tokens": tokens_seen,
                       "elapsed_s": elapsed_before + time.time() - t0, "tokens_per_s": tps,
                       "mfu": tps * flops_per_token / (peak * info.world_size)}
                log.log(row)
                progress.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{lr:.1e}", tok_s=f"{tps:,.0f}")
                pending, t_log = [], time.time()
            if step % cfg.trainer.eval_interval == 0 or last:
                last_eval = evaluate(step_fn, raw_model, windows, cfg, autocast, data.meta, info)
                log.log(report.eval_row(step, tokens_seen, last_eval))
                progress.write(f"step {step}: val loss {last_eval['val_loss']:.4f} | "
                               f"bpb {last_eval['val_bpb']:.4f}") if info.is_main else None
                if cfg.trainer.sample_tokens > 0 and info.is_main and parallel != "fsdp":
                    progress.write(sample_text(raw_model, data.tokenizer(), cfg, autocast))
                t_log = time.time()  # eval time is not training throughput
            if step % cfg.trainer.ckpt_interval == 0 or last:
                ckpt_path = save(step)
                t_log = time.time()
        if stop.signal is not None:
            ckpt_path = save(step)
            say(f"\n{stop.signal}: checkpoint saved at step {step}: {ckpt_path}\n"
                f"resume with: python train.py resume={run.run_dir}")
    finally:
        progress.close()
        stop.restore()
        log.close()
    if stop.signal is not None and run.multirun:
        # Hydra's launcher would start the next job as soon as this one returns: Ctrl-C stops the sweep.
        say(f"{stop.signal}: sweep stopped; the jobs after this one were not started")
        sys.exit(128 + signal.Signals[stop.signal].value)
    if step < cfg.trainer.max_steps and stop.signal is None:
        say(f"stopped at trainer.stop_at_step={step}; continue with: python train.py resume={run.run_dir}")
    elif info.is_main and last_eval is not None and stop.signal is None:
        tokens_run = tokens_seen - start_step * tokens_per_step
        say(report.summary(last_eval, step, tokens_run, time.time() - t0, ckpt_path, run.run_dir))
    return last_eval["val_loss"] if last_eval else float("nan")


register_configs()


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(dict_cfg: DictConfig) -> float:
    info = None
    try:
        info = D.setup(dict_cfg.trainer.device, dict_cfg.trainer.dist_timeout_s)
        return train(resolve_run(dict_cfg, info), info)
    except (ValueError, report.NonFiniteLoss) as e:  # DataError, CheckpointError, ConfigError included
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {e}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN and (info is None or info.world_size == 1):
            # One failed cell (e.g. a diverged variant) must not cancel the rest of a sweep: Hydra
            # records it, runs the remaining jobs, then names the failed job and exits 1. Not under
            # torchrun: a rank that moved on to the next job would leave the others waiting in a collective.
            raise JobFailed(str(e)) from None
        sys.exit(1)
    finally:
        D.teardown()


if __name__ == "__main__":
    main()
