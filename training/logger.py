"""What a run reports while it trains: the progress bar, the training and validation rows of
metrics.jsonl (training/metrics.py) and wandb (online, offline or off), and the throughput clock.
Rank 0 writes and prints; every rank takes part in averaging the losses."""
import contextlib
import math
import netrc
import os
import sys
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from training.checkpoint import run_state
from training.config import LoggerConfig
from training.metrics import MetricsFile
from training.runtime import distributed as D
from training.runtime.memory import peak_memory_bytes


class Throughput:
    """Training tokens per second between two logs: wall time minus the evaluations and checkpoints
    inside the interval (`paused`) and minus compiling (the compiled loss reports its seconds)."""

    def __init__(self, compute_loss):
        self.compute_loss = compute_loss
        self.steps, self.excluded, self.since = 0, 0.0, run_state.clock()
        self.compile_seen = self.compile_s()
        self.paused_by_kind = {}  # kind → (seconds, count) over the whole process: the time budget's costs

    def compile_s(self) -> float:
        return getattr(self.compute_loss, "compile_seconds", 0.0)

    @contextlib.contextmanager
    def paused(self, kind: str = "other"):
        start, compile_start = run_state.clock(), self.compile_s()
        try:
            yield
        finally:
            seconds = run_state.clock() - start
            self.excluded += seconds
            # Compiling inside the pause (the evaluation's first graph) is already excluded with it: counted as
            # seen, lap() does not take it off a second time (which left ~0 s and tokens/s in the trillions).
            self.compile_seen += self.compile_s() - compile_start
            total, count = self.paused_by_kind.get(kind, (0.0, 0))
            self.paused_by_kind[kind] = (total + seconds, count + 1)

    def lap(self) -> tuple:
        """(steps, training seconds) since the last lap; starts the next interval."""
        now, compile_s = run_state.clock(), self.compile_s()
        seconds = now - self.since - self.excluded - (compile_s - self.compile_seen)
        out = (self.steps, max(seconds, 1e-9))
        self.steps, self.excluded, self.since, self.compile_seen = 0, 0.0, now, compile_s
        return out


class Logger:
    """Logs every `trainer.log_interval` steps and at `end`; evaluation rows when the validator has them."""

    def __init__(self, ctx):  # a training/context.py RunContext
        run, cfg, info, state = ctx.run, ctx.cfg, ctx.info, ctx.state
        self.info, self.data, self.state = info, ctx.data, state
        self.interval, self.epoch_warning = cfg.trainer.log_interval, cfg.trainer.epoch_warning
        # data.sampling=epochs counts true passes; random counts epoch-equivalents (tokens drawn ÷ training tokens).
        self.epoch_tokens, self.true_epochs = ctx.epoch_tokens, cfg.data.sampling == "epochs"
        self.tokens_per_step, self.flops_per_token, self.peak = ctx.tokens_per_step, ctx.flops_per_token, ctx.peak
        self.clock = Throughput(ctx.parts.compute_loss)
        self.pending = []  # each step's loss, on the device, until the next log reads them (one sync)
        self.skipped, self.first_skipped = 0, -1  # non-finite steps since the last log
        self.epoch_warned = False
        self.compile_reported = 0.0
        self.metrics, self.wandb = None, None
        if info.is_main:  # before the bar: wandb's notice gets a line of its own, not the bar's
            self.metrics = MetricsFile(run.run_dir)  # a resume has rewound it (checkpoint/resume.py)
            self.wandb = open_wandb(run.run_dir, cfg.logger, cfg.run_name, yaml.safe_load(run.config_yaml))
        # A time budget's first plan comes after its probe: until then the bar has no end (not a stale max_steps).
        total = None if cfg.trainer.time_budget and not state.plans else state.max_steps
        self.progress = tqdm(total=total, initial=state.step, disable=not info.is_main, desc="train",
                             unit="step", dynamic_ncols=True, file=sys.stdout, mininterval=1.0)

    def should_log(self, step: int) -> bool:
        return step % self.interval == 0 or step == self.state.end

    def set_total(self, steps: int) -> None:
        """The progress bar's length, once a time budget has decided it."""
        self.progress.total = steps
        self.progress.refresh()

    def step_done(self, loss: torch.Tensor) -> None:
        self.pending.append(loss)
        self.clock.steps += 1
        self.progress.update(1)

    def note_skipped(self, record: dict) -> None:
        """The non-finite guard's record since its last check (training/step.py)."""
        self.skipped += record["skipped"]
        if self.first_skipped < 0:
            self.first_skipped = record["first_bad"]

    def log_train(self, grad_norm: torch.Tensor, lr: float) -> None:
        """One row: the mean loss over ranks and steps since the last log, throughput, epochs, memory."""
        state = self.state
        losses = D.all_reduce_mean(torch.stack(self.pending), self.info).tolist()  # note: a CPU-GPU sync point
        self.pending = []
        finite = [loss for loss in losses if math.isfinite(loss)]
        loss = sum(finite) / len(finite) if finite else math.nan
        steps, seconds = self.clock.lap()
        tps = steps * self.tokens_per_step / seconds
        epochs = state.tokens_seen / (self.epoch_tokens or 1)
        compile_s = self.clock.compile_s()
        self.log({"kind": "train", "step": state.step, "loss": loss,
                  "lr": lr, "grad_norm": grad_norm.item(), "tokens": state.tokens_seen, "epochs": epochs,
                  "elapsed_s": state.elapsed_s(), "tokens_per_s": tps,
                  "mfu": tps * self.flops_per_token / (self.peak * self.info.world_size),
                  "skipped_steps": self.skipped, "peak_memory_gb": peak_memory_bytes(self.info.device) / 2 ** 30,
                  "compile_s": compile_s, **({"precision": state.precision} if state.precision else {})})
        if compile_s - self.compile_reported > 0.5:
            self.write(f"compile: {compile_s:.0f} s so far (step {state.step}); compiled graphs are reused")
        self.compile_reported = compile_s
        if self.skipped:
            self.write(f"step {state.step}: skipped {self.skipped} non-finite step(s) (first at step "
                       f"{self.first_skipped}); {state.skipped_steps} in total")
        self.skipped, self.first_skipped = 0, -1
        if epochs > self.epoch_warning and not self.epoch_warned:
            self.epoch_warned = True
            what = "epochs" if self.true_epochs else "epoch-equivalents (tokens drawn ÷ training tokens)"
            self.write(f"warning: {epochs:.1f} {what} over the {self.data.meta['train_tokens']:,}-token training "
                       "split: later steps repeat data, so expect the validation loss to rise (checkpoints/best keeps "
                       "the lowest); more data helps more than more steps")
        self.progress.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.1e}", tok_s=f"{tps:,.0f}",
                                  ep=f"{epochs:.2f}")

    def log_eval(self, step: int, tokens: int, ev: dict) -> None:
        row = {"kind": "eval", "step": step, "tokens": tokens, **{k: v for k, v in ev.items() if k != "act_rms"}}
        for name, values in ev.get("act_rms", {}).items():
            row[f"rms_{name}"] = values  # one value per layer
        self.log(row)
        self.write(f"step {step}: val loss {ev['val_loss']:.4f} | bpb {ev['val_bpb']:.4f}")

    def log(self, row: dict) -> None:
        if self.metrics is None:
            return
        row = self.metrics.append(row)
        if self.wandb is not None:
            self.wandb.log(wandb_values(row), step=row["step"])

    def write(self, text: str) -> None:
        """A line above the progress bar, on rank 0."""
        if self.info.is_main:
            self.progress.write(text)

    def close(self) -> None:
        self.progress.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()


def say_for(info: D.DistInfo):
    """How a run speaks: on rank 0, a line of its own above the progress bar (tqdm.write: a warning printed while
    the bar is drawn is not glued to it); on the other ranks, nothing."""
    return (lambda text="": tqdm.write(str(text))) if info.is_main else (lambda *a, **k: None)


def open_wandb(run_dir: Path, cfg: LoggerConfig, run_name: str, config: dict):
    """A wandb run, or None for logger.wandb=disabled. Never prompts for a key (wandb_mode)."""
    mode, warning = wandb_mode(cfg.wandb)
    if warning:
        print(warning, file=sys.stderr)
    if mode == "disabled":
        return None
    import wandb
    return wandb.init(project=cfg.project, name=run_name, group=cfg.group, tags=list(cfg.tags), config=config,
                      dir=str(run_dir), mode=mode, resume="allow", id=_wandb_id(run_dir),
                      settings=wandb.Settings(init_timeout=60, silent=True))


def wandb_mode(requested: str) -> tuple:
    """(mode, warning or None). Online only with an API key configured: without one wandb would ask
    for it on a terminal (or wait for a network it cannot reach). `auto` goes online only with a key;
    WANDB_MODE in the environment counts as a request, as wandb itself reads it."""
    if requested not in ("auto", "online", "offline", "disabled"):
        raise ValueError(f"logger.wandb={requested!r} is unknown; choose auto, online, offline or disabled")
    env = os.environ.get("WANDB_MODE")
    if requested == "auto" and env in ("offline", "disabled", "online"):
        requested, source = env, "WANDB_MODE=online"
    else:
        source = "logger.wandb=online"
    if requested == "online" and not _has_wandb_key():
        raise ValueError(f"{source} but no API key is configured; run `wandb login` or set WANDB_API_KEY, or use "
                         "logger.wandb=offline")
    if requested != "auto":
        return requested, None
    if _has_wandb_key():
        return "online", None
    return "offline", ("wandb: no API key configured, logging offline to the run directory "
                       "(sync later with `wandb sync`, or set logger.wandb=disabled)")


def _has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_values(row: dict) -> dict:
    """A metrics row as wandb series: numbers under `kind/key`, and per-layer lists (rms_residual, …)
    as one series per layer, `eval/rms_residual/layer_3`, since wandb charts scalars, not lists."""
    prefix, out = row["kind"] + "/", {}
    for key, value in row.items():
        if key in ("step", "time"):  # wandb's own axes
            continue
        if isinstance(value, (int, float)):
            out[prefix + key] = value
        elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            width = len(str(len(value) - 1))  # layer_03 sorts before layer_10 in wandb's panel list
            out.update({f"{prefix}{key}/layer_{i:0{width}d}": v for i, v in enumerate(value)})
    return out


def _wandb_id(run_dir: Path) -> str:
    """A stable id per run directory, so a resumed run continues the same wandb run."""
    import hashlib
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
