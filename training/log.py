"""What a run reports: the header and the summary, the progress bar, metrics.jsonl (its one writer and reader) and
wandb, tokens/s and MFU against the device's peak. Rank 0 writes and prints; every rank averages the losses."""

import contextlib
import hashlib
import json
import math
import netrc
import os
import re
import resource
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional

import torch
import yaml
from tqdm import tqdm

from training import distributed as D
from training.budget import PROBE_STEPS, WARMUP_STEPS, clock
from training.checkpoint import METRICS, write_error_cause

# Dense bf16 and TF32 FLOP/s of exact GPU models, matched against the whole name ("H100" alone must not pick the SXM
# card for a PCIe one); NVIDIA data sheets, no sparsity. Any other device is measured (quick_peak).
GPU_PEAKS = {
    r"h100( sxm5?)?( \d+gb)? hbm3e?|h100 sxm5?( \d+gb)?": ("H100 SXM", 989.4e12, 494.7e12, 80),
    r"h100 pcie( \d+gb)?": ("H100 PCIe", 756.5e12, 378.0e12, 80),
    r"h100 nvl": ("H100 NVL", 835.5e12, 417.5e12, 94),
    r"h200( sxm5?)?( \d+gb)?( hbm3e)?": ("H200 SXM", 989.4e12, 494.7e12, 141),
    r"h200 nvl": ("H200 NVL", 835.5e12, 417.5e12, 141),
    r"gh200( \d+gb?)?( hbm3e?)?": ("GH200", 989.4e12, 494.7e12, None),
    r"a100( sxm4?| pcie)?( \d+gb)?( pcie)?": ("A100", 312e12, 156e12, None),
    r"a10": ("A10", 125e12, 62.5e12, 24),
    r"a40": ("A40", 149.7e12, 74.8e12, 48),
    r"l4": ("L4", 121e12, 60e12, 24),
    r"l40": ("L40", 181.05e12, 90.5e12, 48),
    r"l40s": ("L40S", 362.05e12, 183e12, 48),
    r"geforce rtx 4090": ("GeForce RTX 4090", 165.2e12, 82.6e12, 24),
}


def gpu_peak(device_name: str) -> Optional[tuple]:
    """(label, bf16 FLOP/s, TF32 FLOP/s, memory GB or None) of exactly this GPU model, or None."""
    name = re.sub(r"^(nvidia|tesla) ", "", re.sub(r"[-_\s]+", " ", device_name.lower()).strip())
    return next((peak for pattern, peak in GPU_PEAKS.items() if re.fullmatch(pattern, name)), None)


def peak_flops(device: torch.device, precision: str, override_tflops: Optional[float] = None) -> tuple:
    """(FLOP/s, how it was obtained): trainer.peak_tflops, a GPU's data sheet in the run's precision (TF32 only where
    it is on), or one quick probe of this device in the run's dtype (dev/bench measures it properly)."""
    if override_tflops:
        return override_tflops * 1e12, "trainer.peak_tflops"
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{device.type}, {torch.get_num_threads()} threads"
    )
    sheet = gpu_peak(name) if device.type == "cuda" else None
    if sheet is not None and precision == "bf16":
        return sheet[1], f"data sheet: {sheet[0]} dense bf16 ({name})"
    if sheet is not None and torch.backends.cuda.matmul.allow_tf32:
        return sheet[2], f"data sheet: {sheet[0]} dense TF32 ({name})"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return quick_peak(device, dtype), f"one quick {str(dtype)[6:]} matmul probe on {name}"


def quick_peak(device: torch.device, dtype: torch.dtype) -> float:
    """The best of short trials of one square matmul within 0.3 s (a peak is a maximum); operands from a private
    generator, so the training RNG is untouched."""
    n = 4096 if device.type == "cuda" else 512
    a, b = (
        torch.randn(n, n, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype) for _ in range(2)
    )
    best, start = math.inf, time.perf_counter()
    while time.perf_counter() - start < 0.3:
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: the allocator's peak handed to tensors. CPU: the process's max RSS — Python and libraries included."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


# ---- metrics.jsonl -----------------------------------------------------------------------------------------------


class WriteError(ValueError):
    """A write the environment refused (full disk, limits, permissions): one line with the fix."""


class MetricsError(ValueError):
    """metrics.jsonl is corrupt before its last line (a cut-off last line is only a warning)."""


def _write_refused(path: Path, error: OSError) -> WriteError:
    return WriteError(f"cannot write metrics: {write_error_cause(error, path)}")


def read_metrics(path: Path, warn: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> List[dict]:
    """A metrics.jsonl's rows. A kill -9 can cut the last line mid-JSON: dropped with a warning (its step is logged
    again on resume). A broken line before the last is corruption: an error."""
    lines = [(n, line) for n, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1) if line.strip()]
    rows = []
    for i, (n, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif i == len(lines) - 1:
            warn(f"warning: {path}: dropped its cut-off last line {n} (the run was killed while writing it)")
        else:
            raise MetricsError(
                f"{path} line {n} is not a JSON object ({line[:40]!r}) but more rows follow it; the file "
                "is corrupt: fix or delete that line, then resume"
            )
    return rows


def rewind_metrics(run_dir: Path, step: int) -> None:
    """A resume's metrics position: rows after `step` go (logged again). Rewritten aside and renamed: a kill now
    cannot lose the rows it keeps."""
    path = Path(run_dir) / METRICS
    if path.exists():
        temp = path.with_name(path.name + ".tmp")
        try:
            temp.write_text("".join(json.dumps(r) + "\n" for r in read_metrics(path) if r.get("step", 0) <= step))
            os.replace(temp, path)
        except OSError as e:
            raise _write_refused(path, e) from e


# ---- wandb ----------------------------------------------------------------------------------------------------


def wandb_mode(requested: str) -> tuple:
    """(mode, warning or None). Online only with an API key: without one wandb would prompt on a terminal (or wait
    for a network it cannot reach). WANDB_MODE in the environment counts as a request, as wandb reads it."""
    if requested not in ("auto", "online", "offline", "disabled"):
        raise ValueError(f"logger.wandb={requested!r} is unknown; choose auto, online, offline or disabled")
    env, source = os.environ.get("WANDB_MODE"), "logger.wandb=online"
    if requested == "auto" and env in ("offline", "disabled", "online"):
        requested, source = env, "WANDB_MODE=online"
    try:
        has_key = bool(os.environ.get("WANDB_API_KEY")) or netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        has_key = False
    if requested == "online" and not has_key:
        raise ValueError(
            f"{source} but no API key is configured; run `wandb login` or set WANDB_API_KEY, or use "
            "logger.wandb=offline"
        )
    if requested != "auto":
        return requested, None
    if has_key:
        return "online", None
    return "offline", (
        "wandb: no API key configured, logging offline to the run directory (sync later with `wandb "
        "sync`, or set logger.wandb=disabled)"
    )


def open_wandb(run_dir: Path, cfg, run_name: str, config: dict):
    """A wandb run (resumed by a stable id per run directory), or None for logger.wandb=disabled; never a prompt."""
    mode, warning = wandb_mode(cfg.wandb)
    if warning:
        print(warning, file=sys.stderr)
    if mode == "disabled":
        return None
    import wandb

    run_id = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
    return wandb.init(
        project=cfg.project,
        name=run_name,
        group=cfg.group,
        tags=list(cfg.tags),
        config=config,
        dir=str(run_dir),
        mode=mode,
        resume="allow",
        id=run_id,
        settings=wandb.Settings(init_timeout=60, silent=True),
    )


def wandb_values(row: dict) -> dict:
    """A metrics row as wandb series: numbers under `kind/key`; per-layer lists one series a layer
    (`eval/rms_residual/layer_03`: zero-padded, so layer_03 sorts before layer_10)."""
    prefix, out = row["kind"] + "/", {}
    for key, value in row.items():
        if key in ("step", "time"):  # wandb's own axes
            continue
        if isinstance(value, (int, float)):
            out[prefix + key] = value
        elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            width = len(str(len(value) - 1))
            out.update({f"{prefix}{key}/layer_{i:0{width}d}": v for i, v in enumerate(value)})
    return out


# ---- the logger ---------------------------------------------------------------------------------------------------


class Throughput:
    """Training tokens/s between two logs: wall time minus the evaluations and checkpoints inside (`paused`) and
    minus compiling (the compiled loss counts its seconds)."""

    def __init__(self, compute_loss):
        self.compute_loss, self.steps, self.excluded, self.since = compute_loss, 0, 0.0, clock()
        self.compile_seen = self.compile_s()
        self.paused_by_kind = {}  # kind → (seconds, count) over the process: the time budget's costs

    def compile_s(self) -> float:
        return getattr(self.compute_loss, "compile_seconds", 0.0)

    @contextlib.contextmanager
    def paused(self, kind: str = "other"):
        start, compile_start = clock(), self.compile_s()
        try:
            yield
        finally:
            seconds = clock() - start
            self.excluded += seconds
            self.compile_seen += self.compile_s() - compile_start  # excluded with the pause already: not twice
            total, count = self.paused_by_kind.get(kind, (0.0, 0))
            self.paused_by_kind[kind] = (total + seconds, count + 1)

    def lap(self) -> tuple:
        """(steps, training seconds) since the last lap; starts the next."""
        now, compile_s = clock(), self.compile_s()
        out = (self.steps, max(now - self.since - self.excluded - (compile_s - self.compile_seen), 1e-9))
        self.steps, self.excluded, self.since, self.compile_seen = 0, 0.0, now, compile_s
        return out


def say_for(info: D.DistInfo):
    """Rank 0's lines, above the progress bar (a line printed while the bar is drawn is not glued to it); others quiet."""
    return (lambda text="": tqdm.write(str(text))) if info.is_main else (lambda *a, **k: None)


class Logger:
    """A row every trainer.log_interval steps and at the end (the loop asks should_log); evaluation rows when the
    validation has them. `epoch_tokens`: what one epoch trains on (data.sampling=epochs counts true passes)."""

    def __init__(
        self,
        run_dir: Path,
        cfg,
        config_yaml: str,
        info: D.DistInfo,
        state,
        compute_loss,
        tokens_per_step: int,
        flops_per_token: float,
        peak: float,
        epoch_tokens: int,
        train_tokens: int,
    ):
        self.info, self.state = info, state
        self.interval, self.epoch_warning = cfg.trainer.log_interval, cfg.trainer.epoch_warning
        self.tokens_per_step, self.flops_per_token, self.peak = tokens_per_step, flops_per_token, peak
        self.epoch_tokens, self.train_tokens = epoch_tokens, train_tokens
        self.true_epochs = cfg.data.sampling == "epochs"
        self.clock = Throughput(compute_loss)
        self.pending, self.skipped, self.first_skipped = [], 0, -1  # losses on the device until a log reads them
        self.epoch_warned, self.compile_reported, self.file, self.failed, self.wandb = False, 0.0, None, False, None
        self.path = Path(run_dir) / METRICS
        if info.is_main:  # before the bar: wandb's notice gets a line of its own
            try:
                self.file = open(self.path, "a", buffering=1)  # line-buffered: a kill loses at most one row
            except OSError as e:
                raise _write_refused(self.path, e) from e
            self.wandb = open_wandb(run_dir, cfg.logger, cfg.run_name, yaml.safe_load(config_yaml))
        total = None if cfg.trainer.time_budget and not state.plans else state.max_steps  # a budget's end comes later
        self.progress = tqdm(
            total=total,
            initial=state.step,
            disable=not info.is_main,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            file=sys.stdout,
            mininterval=1.0,
        )

    def should_log(self, step: int) -> bool:
        return step % self.interval == 0 or step == min(
            self.state.max_steps, self.state.stop_at or self.state.max_steps
        )

    def set_total(self, steps: int) -> None:
        self.progress.total = steps
        self.progress.refresh()

    def step_done(self, loss: torch.Tensor) -> None:
        self.pending.append(loss)
        self.clock.steps += 1
        self.progress.update(1)

    def note_skipped(self, record: dict) -> None:
        """The non-finite guard's record since its last check (training/loop.py)."""
        self.skipped += record["skipped"]
        self.first_skipped = record["first_bad"] if self.first_skipped < 0 else self.first_skipped

    def log_train(self, grad_norm: torch.Tensor, lr: float) -> None:
        """One row: the mean loss over ranks and steps since the last log, throughput, epochs, memory."""
        state = self.state
        losses = [x for x in D.all_reduce_mean(torch.stack(self.pending), self.info).tolist() if math.isfinite(x)]
        self.pending = []  # note: the line above is a CPU-GPU sync point, once per log
        loss = sum(losses) / len(losses) if losses else math.nan
        steps, seconds = self.clock.lap()
        tps, epochs = steps * self.tokens_per_step / seconds, state.tokens_seen / (self.epoch_tokens or 1)
        compile_s = self.clock.compile_s()
        self.log(
            {
                "kind": "train",
                "step": state.step,
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm.item(),
                "tokens": state.tokens_seen,
                "epochs": epochs,
                "elapsed_s": state.elapsed_s(),
                "tokens_per_s": tps,
                "mfu": tps * self.flops_per_token / (self.peak * self.info.world_size),
                "skipped_steps": self.skipped,
                "peak_memory_gb": peak_memory_bytes(self.info.device) / 2**30,
                "compile_s": compile_s,
                **({"precision": state.precision} if state.precision else {}),
            }
        )
        if compile_s - self.compile_reported > 0.5:
            self.write(f"compile: {compile_s:.0f} s so far (step {state.step}); compiled graphs are reused")
        self.compile_reported = compile_s
        if self.skipped:
            self.write(
                f"step {state.step}: skipped {self.skipped} non-finite step(s) (first at step "
                f"{self.first_skipped}); {state.skipped_steps} in total"
            )
        self.skipped, self.first_skipped = 0, -1
        if epochs > self.epoch_warning and not self.epoch_warned:
            self.epoch_warned = True
            what = "epochs" if self.true_epochs else "epoch-equivalents (tokens drawn ÷ training tokens)"
            self.write(
                f"warning: {epochs:.1f} {what} over the {self.train_tokens:,}-token training split: later "
                "steps repeat data, so expect the validation loss to rise (checkpoints/best keeps the lowest); "
                "more data helps more than more steps"
            )
        self.progress.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.1e}", tok_s=f"{tps:,.0f}", ep=f"{epochs:.2f}")

    def log_eval(self, step: int, tokens: int, ev: dict) -> None:
        row = {"kind": "eval", "step": step, "tokens": tokens, **{k: v for k, v in ev.items() if k != "act_rms"}}
        self.log({**row, **{f"rms_{name}": values for name, values in ev.get("act_rms", {}).items()}})
        self.write(f"step {step}: val loss {ev['val_loss']:.4f} | bpb {ev['val_bpb']:.4f}")

    def log(self, row: dict) -> None:
        if self.file is None:
            return
        row = {"time": time.time(), **row}
        try:
            self.file.write(json.dumps(row) + "\n")
        except OSError as e:  # a full disk: one line, not a traceback from inside the loop
            self.failed = True
            raise _write_refused(self.path, e) from e
        if self.wandb is not None:
            self.wandb.log(wandb_values(row), step=row["step"])

    def write(self, text: str) -> None:
        if self.info.is_main:
            self.progress.write(text)

    def close(self) -> None:
        self.progress.close()
        if self.file is not None:
            try:  # after a refused write, closing flushes the same line into the same full disk: the same error
                self.file.close()
            except OSError as e:
                if not self.failed:
                    raise _write_refused(self.path, e) from e
        if self.wandb is not None:
            self.wandb.finish()


# ---- the header and the summary -----------------------------------------------------------------------------------


def header(
    cfg,
    run_dir: Path,
    state,
    raw_model,
    data,
    info: D.DistInfo,
    tokens_per_step: int,
    precision: str,
    notes: tuple,
    parallel: str,
    peak: tuple,
    resume=None,
    init=None,
) -> str:
    """The run's first lines: where it lives, the model, the data, the batch, the precision, the steps."""
    counts, m, t = raw_model.param_counts(), cfg.model, cfg.trainer
    limits = [plan["limit"] for plan in state.plans if plan.get("limit")]
    timed = [plan for plan in state.plans if not plan.get("limit")]
    budget = f"trainer.time_budget={t.time_budget:g} min" if t.time_budget else ""
    again = state.step + WARMUP_STEPS + PROBE_STEPS
    if budget and limits:
        when = (
            f"planned {len(timed)} time{'s' * (len(timed) > 1)} so far, again from step {again}"
            if timed
            else f"the budget's first plan after step {again}, then at every evaluation and as the end nears"
        )
        end = f"{state.max_steps} ({budget} or {limits[0]}, whichever comes first: {when})"
    elif budget and state.plans:
        end = f"{state.max_steps} (planned by {budget}, {len(state.plans)} plan{'s' * (len(state.plans) > 1)} so far; planned again from step {again})"
    elif budget:
        end = f"? ({budget} decides: a first plan after step {again}, then again at every evaluation and as the end nears)"
    elif t.max_epochs and t.max_steps != state.max_steps:
        end = f"{state.max_steps} (trainer.max_epochs={t.max_epochs:g}: " + (
            "passes over every window)" if cfg.data.sampling == "epochs" else "epoch-equivalents of random windows)"
        )
    else:
        end = f"{state.max_steps} (trainer.max_steps)"
    return "\n".join(
        [
            f"run dir: {run_dir}" + (f" (resuming {resume.path})" if resume else ""),
            *([init.describe()] if init and not resume else []),
            f"model: {m.norm} + {m.mlp}, hidden_size {m.hidden_size}, intermediate_size {m.resolved_intermediate_size}, "
            f"{m.depth}, parametrization {m.describe_parametrization()}, {counts['total'] / 1e6:.2f}M parameters (embedding "
            f"{counts['embedding'] / 1e6:.2f}M, attention {counts['attention'] / 1e6:.2f}M, mlp {counts['mlp'] / 1e6:.2f}M, "
            f"norm {counts['norm'] / 1e3:.1f}K)",
            f"data: {data.meta['source']}: {data.meta['train_tokens']:,} train / {data.meta['val_tokens']:,} val tokens, "
            f"vocab {data.meta['vocab_size']}, cache {data.dir}",
            f"tokens per optimizer step: {t.micro_batch_size} micro batch × {t.seq_len} seq_len × {t.grad_accum_steps} "
            f"accumulation × {info.world_size} processes = {tokens_per_step:,}",
            f"{info.device}, {precision} ({notes[0]}), parallel={parallel}, compile: {notes[1]}",
            f"MFU peak {peak[0] / 1e12:.2f} TFLOP/s ({peak[1]}), steps {state.step}→{end}",
        ]
    )


def summary(outcome, run_dir: Path, device: torch.device) -> str:
    """The end of a finished run: steps, tokens and time; final and best validation; what ended it; memory; files."""
    state, ev, ckpt, wall_s = outcome.state, outcome.last_eval, outcome.checkpoint, outcome.wall_s
    lines = [
        "",
        f"done: {state.step} steps, {outcome.tokens_run:,} tokens in {wall_s / 60:.1f} min "
        f"({outcome.tokens_run / max(wall_s, 1e-9):,.0f} tokens/s)",
        f"final val loss {ev['val_loss']:.4f} | perplexity {ev['val_ppl']:.2f} | bits per byte {ev['val_bpb']:.4f}",
    ]
    if state.stopped_early:
        lines.append(
            f"stopped early at step {state.step} of {state.max_steps}: no lower validation bpb in "
            f"{state.evals_since_best} evaluations (trainer.early_stopping)"
        )
    if state.best_step is not None and state.best_step != state.step:
        lines.append(
            f"best val bits per byte {state.best_val_bpb:.4f} at step {state.best_step}: {run_dir}/checkpoints/best "
            "(resume=best, generate.py best, evaluate.py best)"
        )
    if state.budget_decided:
        minutes, used = state.budget_minutes, state.elapsed_s()
        if outcome.limit:
            why = (
                "more passes over the same data stop lowering the validation loss"
                if "max_epochs" in outcome.limit
                else "the run ends at whichever comes first"
            )
            lines.append(
                f"stopped at {outcome.limit}, after {used / 60:.2f} of trainer.time_budget={minutes:g} min: "
                f"{why} (docs/training.md)"
            )
        else:
            lines.append(
                f"time budget {minutes:g} min: the training loop took {used / 60:.2f} min "
                f"({used / (60 * minutes) - 1:+.1%}), {len(state.plans)} plans (state.json)"
            )
    if state.skipped_steps:
        lines.append(f"skipped {state.skipped_steps} non-finite step(s) (trainer.skip_nonfinite_steps)")
    memory = "CUDA max allocated" if device.type == "cuda" else "process max RSS"
    return "\n".join(
        lines
        + [
            f"peak memory {peak_memory_bytes(device) / 2**30:.2f} GiB ({memory})",
            f"checkpoint: {ckpt}",
            f"metrics:    {run_dir}/metrics.jsonl",
            f"generate:   python scripts/generate.py {ckpt} --prompt '' --max-new-tokens 200",
        ]
    )
