"""The training run: build its parts (precision, compile, the loss, the optimizers), the step, validation, and one
loop you read top to bottom. A plain step enters this file, the loader, the optimizers, the logger and the budget."""

import contextlib
import itertools
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from data import SAMPLERS, eval_windows, windows_per_epoch
from data.tokenizer import read_special_tokens
from model.attention import hook_attention_logits
from model.transformer import Transformer
from training import distributed as D
from training import one_line
from training.budget import TimeBudget, clock
from training.checkpoint import Checkpointer, InitFrom, Resume, RunState, data_identity
from training.config import TrainConfig
from training.evaluation import IGNORE_INDEX, Windows, evaluate, full_split_windows, score
from training.log import Logger, header, peak_flops, rewind_metrics, say_for
from training.optim import apply_schedule, build_optimizers

# ---- precision: bf16 autocast over fp32 masters where bf16 matmuls run in hardware, else fp32 ----------------------


def resolve_precision(requested: str, device: torch.device) -> Tuple[str, str]:
    """(bf16 | fp32, why). auto: bf16 on CUDA with bf16 and on CPUs with bf16 in hardware (AMX, AVX512-BF16), from
    what the device reports; fp32 elsewhere (an AVX2-only CPU emulates bf16: 19–21× slower, BENCHMARKS.md)."""
    if requested != "auto":  # TrainerConfig refused anything but auto, bf16 and fp32
        return requested, "trainer.precision"
    fast, why = D.bf16_fast(device)
    return ("bf16" if fast else "fp32"), why + ("" if fast or device.type != "cpu" else ": bf16 is emulated")


def resume_precision(
    requested: str, device: torch.device, trained_in: str, step: int
) -> Tuple[str, str, Optional[str]]:
    """(precision, why, warning) for a resume of a run that trained in `trained_in` ('': a new run, as resolved).
    auto keeps the run's precision — a run whose numerics change midway is not what an uninterrupted run computes —
    except bf16 where this device would not choose it (a session moved to an AVX2 CPU), which goes on in fp32."""
    if trained_in not in ("bf16", "fp32"):
        return (*resolve_precision(requested, device), None)
    if requested == "auto" and trained_in == "fp32":
        return "fp32", "the run trained in fp32: a resume keeps it (trainer.precision=bf16 switches)", None
    precision, why = resolve_precision(requested, device)
    if precision == trained_in:
        return (
            precision,
            (f"the run trained in {trained_in}: a resume keeps it; {why}" if requested == "auto" else why),
            None,
        )
    because = f"trainer.precision={requested}" if requested != "auto" else f"{why}, so auto does not keep bf16"
    return (
        precision,
        why,
        (
            f"warning: this run trained in {trained_in} up to step {step} and continues in {precision} "
            f"({because}): from here on it is not what an uninterrupted run computes"
            + ("; trainer.precision=bf16 keeps bf16, slowly" if requested == "auto" else "")
        ),
    )


def autocast_context(precision: str, device: torch.device) -> Callable:
    """A factory of the run's autocast: bf16 matmuls over fp32 weights, gradients and optimizer state (bf16 has fp32's
    range: no loss scaling), or nothing."""
    if precision == "fp32":
        return contextlib.nullcontext
    if device.type == "mps":
        raise ValueError("trainer.precision=bf16 autocast is not supported on mps here; use trainer.precision=fp32")
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def enable_tf32(device: torch.device, enabled: bool = True) -> bool:
    """fp32 matmuls on CUDA's TF32 tensor cores (fp32 range, 10-bit mantissa inputs, fp32 accumulation: ~8× on
    A100/H100 at no measurable cost to training), or exact fp32 (trainer.tf32=false); no effect off CUDA."""
    if device.type != "cuda":
        return False
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    return enabled


# ---- torch.compile where it works ------------------------------------------------------------------------------------


def cache_for_this_cpu() -> Path:
    """Inductor's cache, one folder per ATen CPU capability: torch 2.13's cache key leaves it out, and graphs reused
    across capabilities corrupted the heap or made a first step non-finite. Idempotent; before anything compiles."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # here: torch._inductor imports dynamo (~2 s)

    current = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()).absolute()
    root = current.parent if current.name.startswith("aten-") else current
    folder = root / f"aten-{torch.backends.cpu.get_cpu_capability().lower()}"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    return folder


def resolve_compile(requested: Union[str, bool], device: torch.device) -> Tuple[bool, str]:
    """(compile?, why). auto: CUDA with Triton, and a CPU whose inductor toolchain compiles and runs one tiny function
    right (the only honest check: a compiler can exist without OpenMP or torch's headers); else eager."""
    cache_for_this_cpu()
    choice = str(requested).lower()  # TrainerConfig refused anything but auto, true and false
    if choice != "auto":
        return choice == "true", f"trainer.compile={choice}"
    if not torch._dynamo.is_dynamo_supported():
        return False, f"torch.compile does not support Python {sys.version_info.major}.{sys.version_info.minor}"
    if device.type == "cuda":
        from torch.utils._triton import has_triton  # tests patch the module's has_triton

        return (
            (True, "CUDA: inductor with Triton kernels")
            if has_triton()
            else (False, "CUDA without Triton: inductor cannot generate GPU kernels here")
        )
    if device.type != "cpu":
        return False, f"torch.compile is not used on {device.type} (inductor support there is incomplete)"
    return cpu_toolchain_works()


def cpu_toolchain_works() -> Tuple[bool, str]:
    """Compiles and runs one tiny function with inductor (~1 s with a warm cache); the answer is kept for the process."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None:
        probe = lambda x: torch.relu(x * 2.0 - 3.0).cumsum(0)  # noqa: E731
        try:
            x = torch.arange(8, dtype=torch.float32)
            ok = torch.equal(torch.compile(probe, backend="inductor", fullgraph=True)(x), probe(x))
            _TOOLCHAIN = (
                ok,
                "CPU: inductor's C++ toolchain works" if ok else "CPU: inductor's test kernel gave a wrong result",
            )
        except Exception as e:  # any failure here means "don't compile", with the reason
            _TOOLCHAIN = (False, f"CPU: inductor's C++ toolchain failed ({one_line(e, 200, typed=True)})")
    return _TOOLCHAIN


_TOOLCHAIN: Optional[Tuple[bool, str]] = None


class CompiledLoss:
    """torch.compile(loss_module), falling back to eager with one warning when compiling fails (at the first call of
    each mode); counts the seconds those calls took. Other attributes reach the wrapped module."""

    def __init__(self, module: nn.Module, warn: Callable[[str], None] = lambda m: print(m, file=sys.stderr), **kwargs):
        self.module, self.warn, self.failed, self.compile_seconds, self._modes = module, warn, None, 0.0, set()
        cache_for_this_cpu()
        try:
            self.compiled = torch.compile(module, **kwargs)
        except Exception as e:  # an unknown backend: the same as a failing first call
            self._fall_back(e)

    def __call__(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.failed is not None:
            return self.module(input_ids, targets)
        mode, start = (torch.is_grad_enabled(), self.module.training), time.perf_counter()
        config = torch._functorch.config  # compile the backward during the forward, so its failure falls back too
        try:
            with config.patch(force_non_lazy_backward_lowering=True):
                out = self.compiled(input_ids, targets)
        except torch._dynamo.exc.TorchDynamoException as e:
            self._fall_back(e)
            return self.module(input_ids, targets)
        if mode not in self._modes:
            self._modes.add(mode)
            self.compile_seconds += time.perf_counter() - start
        return out

    def __getattr__(self, name):
        if "module" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["module"], name)

    def _fall_back(self, error: Exception) -> None:
        self.failed = one_line(error, 200, typed=True)
        self.warn(
            f"warning: torch.compile failed ({self.failed}); continuing without compile (set "
            "trainer.compile=false to skip the attempt)"
        )


# ---- the loss ------------------------------------------------------------------------------------------------------

CHUNK_ABOVE = 2**26  # logits elements (B·T·V) above which the loss is chunked by default: 256 MB of fp32
CHUNK_ELEMENTS = 2**24  # fp32 logits per chunk (64 MB): big enough for well-shaped matmuls


class CausalLMLoss(nn.Module):
    """forward(input_ids, targets) → fp32 mean cross-entropy over targets != -100; model, head and loss in one module
    (fused under compile). Above chunk_above logits ("auto": 2^26, 0: always, None: never) it goes in chunks."""

    def __init__(
        self, model: nn.Module, chunk_above: Union[str, int, None] = "auto", chunk_elements: int = CHUNK_ELEMENTS
    ):
        super().__init__()
        chunk_above = CHUNK_ABOVE if chunk_above == "auto" else chunk_above
        self.model, self.chunk_above, self.chunk_elements = model, chunk_above, chunk_elements

    def chunk_tokens(self, n_tokens: int, vocab_size: int) -> Optional[int]:
        """Tokens per chunk for this batch, or None for the one-shot cross-entropy."""
        if self.chunk_above is None or n_tokens * vocab_size <= self.chunk_above:
            return None
        return max(1, min(n_tokens, self.chunk_elements // vocab_size))

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden = self.model.lm_head_input(self.model.hidden_states(input_ids))  # (B, T, D)
        head = self.model.lm_head
        chunk = self.chunk_tokens(targets.numel(), head.weight.shape[0])
        if chunk is None:  # the softmax in fp32: a bf16 log-softmax rounds away rare tokens' probabilities
            return F.cross_entropy(head(hidden).flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        return chunked_cross_entropy(hidden.flatten(0, 1), head.weight, targets.flatten(), chunk)


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean cross_entropy(hidden (N, D) @ weight (V, D).T, targets), chunk_tokens rows at a time, each chunk's gradient
    computed right away: neither pass holds N × V logits. Matmuls in the autocast dtype, softmax in fp32."""
    device_type = hidden.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(device_type, enabled=False):  # the dtypes are explicit inside
        return _ChunkedCrossEntropy.apply(hidden, weight, targets, chunk_tokens, dtype, needs_grad)


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens, dtype, needs_grad):
        w, acc = weight.to(dtype), torch.promote_types(dtype, torch.float32)  # (V, D); sums in fp32 at least
        valid = targets != IGNORE_INDEX
        row_scale = valid.to(acc) / valid.sum()  # the mean's denominator is known: each chunk's gradient is final
        safe_targets, loss = targets.masked_fill(~valid, 0), hidden.new_zeros((), dtype=acc)
        grad_hidden = torch.empty_like(hidden) if needs_grad else None
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if needs_grad else None
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            h = hidden[rows].to(dtype)  # (n, D)
            logits = (h @ w.T).to(acc)  # (n, V): the only chunk-sized fp32 buffer
            lse = torch.logsumexp(logits, dim=-1)
            loss = loss + ((lse - logits.gather(1, safe_targets[rows, None]).squeeze(1)) * row_scale[rows]).sum()
            if needs_grad:  # d(mean CE)/d logits = (softmax − one-hot) × valid / n_valid, built in the buffer
                grad = logits.sub_(lse[:, None]).exp_()
                grad.scatter_add_(1, safe_targets[rows, None], grad.new_full((grad.shape[0], 1), -1.0))
                grad = grad.mul_(row_scale[rows, None]).to(dtype)
                grad_hidden[rows] = (grad @ w).to(hidden.dtype)
                grad_weight += (grad.T @ h).to(acc)  # summed in fp32, rounded once, as one big matmul would be
        if needs_grad:
            ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None, None, None


# ---- building the run ---------------------------------------------------------------------------------------------


@dataclass
class Parts:
    """The model, the loss module and its optimizers, plus the precision and compile decisions and why."""

    raw_model: nn.Module  # the bare Transformer: checkpoints, hooks, samples
    loss_module: nn.Module  # CausalLMLoss, wrapped for DDP/FSDP2
    compute_loss: object  # loss_module, or its compiled version: what steps and evaluations call
    optimizers: list
    autocast: Callable
    precision: str  # bf16 | fp32
    parallel: str  # none | ddp | fsdp
    notes: tuple  # (precision why, compile note) for the header


def build(
    cfg: TrainConfig, info: D.DistInfo, say, resume: Optional[Resume] = None, init: Optional[InitFrom] = None
) -> Parts:
    """Model, loss and optimizers, the same initial weights on every rank (seeded, or init_from's checkpoint); a resume
    keeps its run's precision, and its weights are put back later, into the wrapped model."""
    t = cfg.trainer
    if t.num_threads:
        torch.set_num_threads(t.num_threads)
    precision, why, warning = resume_precision(
        t.precision, info.device, resume.precision if resume else "", resume.step if resume else 0
    )
    if warning:
        say(warning)
    if enable_tf32(info.device, t.tf32) and precision == "fp32":
        why += "; matmuls on TF32 tensor cores (trainer.tf32)"
    torch.manual_seed(cfg.seed)
    raw_model = Transformer(cfg.model).to(info.device)
    if info.device.type == "cpu":
        D.check_cpu_memory(raw_model, t.micro_batch_size * t.seq_len)
    if init is not None and resume is None:
        init.load(raw_model)
    parallel = D.resolve_parallel(t.parallel, info.world_size)
    chunk_above = {"auto": "auto", "true": 0, "false": None}[t.chunked_loss]
    loss_module = D.wrap_model(CausalLMLoss(raw_model, chunk_above), raw_model.layers, parallel, info, precision)
    optimizers = build_optimizers(loss_module, cfg.optim, info.device.type)
    compute_loss, compile_note = loss_module, "off: trainer.compile=false"
    if t.compile != "false":  # model + loss compiled as one graph, for training and evaluation alike
        compiled, compile_why = resolve_compile(t.compile, info.device)
        compute_loss = CompiledLoss(loss_module, warn=say) if compiled else loss_module
        compile_note = compile_why if compiled else f"off: {compile_why}"
    # Dropout differs per rank (each rank sees other rows); batches never draw from this generator.
    torch.manual_seed(int(np.random.SeedSequence([cfg.seed, info.rank]).generate_state(1)[0]))
    return Parts(
        raw_model,
        loss_module,
        compute_loss,
        optimizers,
        autocast_context(precision, info.device),
        precision,
        parallel,
        (why, compile_note),
    )


def epoch_tokens(cfg: TrainConfig, train_tokens: int) -> int:
    """One epoch's tokens: every window's targets under data.sampling=epochs (a true pass); the split under random,
    whose epochs are epoch-equivalents (tokens drawn ÷ training tokens)."""
    if cfg.data.sampling == "epochs":
        return windows_per_epoch(train_tokens, cfg.trainer.seq_len) * cfg.trainer.seq_len
    return train_tokens


def planned_steps(cfg: TrainConfig, train_tokens: int, tokens_per_step: int) -> Optional[int]:
    """Where trainer.max_steps and max_epochs end the run (the first reached of those set), or None (a time budget
    alone decides): max_epochs is ceil(epochs × epoch_tokens ÷ tokens per step), at least one step."""
    t = cfg.trainer
    limits = ([t.max_steps] if t.max_steps else []) + (
        [max(1, math.ceil(t.max_epochs * epoch_tokens(cfg, train_tokens) / tokens_per_step))] if t.max_epochs else []
    )
    return min(limits) if limits else None


def length_limit(cfg: TrainConfig, train_tokens: int, tokens_per_step: int) -> str:
    """Which of max_steps and max_epochs ends the run, as the header says it: "4 passes over every window
    (trainer.max_epochs=4)"; '' when neither is set."""
    t, steps = cfg.trainer, planned_steps(cfg, train_tokens, tokens_per_step)
    if steps is None:
        return ""
    if t.max_steps == steps or not t.max_epochs:
        return f"trainer.max_steps={steps}"
    unit = "passes over every window" if cfg.data.sampling == "epochs" else "epoch-equivalents of random windows"
    return f"{t.max_epochs:g} {unit} (trainer.max_epochs={t.max_epochs:g})"


def data_views(cfg: TrainConfig, data, info: D.DistInfo) -> tuple:
    """(training batches, this rank's validation windows)."""
    t = cfg.trainer
    batches = SAMPLERS[cfg.data.sampling](
        data.train_tokens(), t.seq_len, t.micro_batch_size, cfg.seed, info.rank, info.world_size, t.grad_accum_steps
    )
    if t.num_eval_windows is None:  # every token of the split, scored once
        return batches, full_split_windows(
            data.val_tokens(), t.seq_len, data.meta["eos_id"], rank=info.rank, world_size=info.world_size
        )
    tiles = eval_windows(data.val_tokens(), t.seq_len, t.num_eval_windows, info.rank, info.world_size)
    return batches, Windows.from_tiles(tiles)


# ---- the step --------------------------------------------------------------------------------------------------------


class NonFiniteLoss(ValueError):
    """Non-finite losses or gradients: their updates were skipped, nothing non-finite was saved."""


def global_grad_norm(params: list) -> torch.Tensor:
    """The L2 norm of all gradients; under FSDP2 each rank holds shards (DTensors) whose norm must be reduced."""
    norm = torch.nn.utils.get_total_norm(
        [p.grad for p in params if p.grad is not None], norm_type=2.0, error_if_nonfinite=False
    )
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class NonFiniteGuard:
    """Device-side counters of skipped steps and the policy reading them: stop at the first non-finite step
    (tolerated=0), or at the `tolerated`-th in a row (OLMo's spike guard)."""

    def __init__(self, device: torch.device, tolerated: int = 0):
        zero = lambda v=0: torch.tensor(v, device=device, dtype=torch.int64)  # noqa: E731
        self.tolerated = tolerated
        self.skipped, self.streak, self.max_streak, self.first_bad = zero(), zero(), zero(), zero(-1)

    def update(self, finite: torch.Tensor, step: int) -> None:
        """Count optimizer step `step` (1-based) as skipped unless `finite`, on the device."""
        bad = (~finite).long()
        self.skipped += bad
        self.streak.add_(1).mul_(bad)  # +1 on a bad step, back to 0 on a good one
        torch.maximum(self.max_streak, self.streak, out=self.max_streak)
        self.first_bad.copy_(torch.where((self.first_bad < 0) & (bad > 0), step, self.first_bad))

    def read(self) -> dict:
        """Host values since the last read (note: a CPU-GPU sync point, once per log/eval/save step)."""
        values = torch.stack([self.skipped, self.streak, self.max_streak, self.first_bad]).tolist()
        self.skipped.zero_()
        self.max_streak.copy_(self.streak)
        self.first_bad.fill_(-1)
        return dict(zip(("skipped", "streak", "max_streak", "first_bad"), values))

    def check(self, step: int, last_good: Callable[[], Optional[Path]]) -> dict:
        """The record since the last check; NonFiniteLoss when the policy says stop (only then is `last_good` asked
        for the checkpoint to name: it hashes files)."""
        record = self.read()
        if record["max_streak"] < self.tolerated or not (self.tolerated or record["skipped"]):
            return record
        where = f"the last good checkpoint is {good}" if (good := last_good()) else "no checkpoint was written yet"
        advice = "lower optim.lr, raise optim.warmup_steps or check the data"
        if self.tolerated == 0:
            raise NonFiniteLoss(
                f"non-finite loss or gradient at step {record['first_bad']} (update skipped, weights "
                f"unchanged); {where} — {advice}, or set trainer.skip_nonfinite_steps=N to skip such steps"
            )
        raise NonFiniteLoss(
            f"{record['max_streak']} non-finite steps in a row (trainer.skip_nonfinite_steps="
            f"{self.tolerated}) by step {step}; {where} — {advice}"
        )


class TrainStep:
    """step(n): the micro-batches of optimizer step n (0-based) under autocast, backward, clip, and the update
    unless the loss or gradient norm is not finite — then nothing reaches the weights, and the guard counts it."""

    def __init__(
        self,
        loss_module,
        batches,
        optimizers: list,
        autocast: Callable,
        accum: int,
        grad_clip: float,
        device: torch.device,
        tolerated: int = 0,
    ):
        self.loss_module, self.batches, self.optimizers, self.autocast = loss_module, batches, optimizers, autocast
        self.accum, self.grad_clip, self.device = accum, grad_clip, device
        self.params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
        self.guard = NonFiniteGuard(device, tolerated)

    def __call__(self, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(the mean loss over the micro-batches, the gradient norm before clipping), both on the device."""
        total = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            x, y = (t.to(self.device, non_blocking=True) for t in self.batches.get(step, micro))
            # DDP all-reduces gradients on the last micro-step only, not `accum` times.
            skip_sync = hasattr(self.loss_module, "no_sync") and micro < self.accum - 1
            with self.loss_module.no_sync() if skip_sync else contextlib.nullcontext():
                with self.autocast():  # the forward only: backward runs in the dtypes the forward chose
                    loss = self.loss_module(x, y) / self.accum
                loss.backward()
            total += loss.detach()
        grad_norm = global_grad_norm(self.params)
        finite = torch.isfinite(total) & torch.isfinite(grad_norm)
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, grad_norm)
        if bool(finite):  # note: a CPU-GPU sync point on CUDA (host memory on a CPU): nothing non-finite is applied
            for opt in self.optimizers:
                opt.step()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        self.guard.update(finite, step + 1)
        return total, grad_norm


# ---- validation ------------------------------------------------------------------------------------------------------


def _rms(t: torch.Tensor) -> float:
    return t.detach().float().pow(2).mean().sqrt().item()


@torch.no_grad()
def activation_rms(
    model: nn.Module, input_ids: torch.Tensor, forward: Optional[Callable] = None
) -> Dict[str, List[float]]:
    """Per layer, on one batch: the RMS of the residual stream, of the norms' outputs and of the first sequence's
    attention logits. `forward` runs what wraps `model` (FSDP2's root gathers embedding and head)."""
    stats: Dict[str, List[float]] = {"residual": [], "attn_in": [], "mlp_in": [], "attn_logits": []}
    hooks = []
    for block in model.layers:
        for part, key in ((block, "residual"), (block.attn_norm, "attn_in"), (block.mlp_norm, "mlp_in")):
            hooks.append(part.register_forward_hook(lambda m, i, out, key=key: stats[key].append(_rms(out))))
        hooks += hook_attention_logits(block.attn, lambda logits: stats["attn_logits"].append(_rms(logits)), rows=1)
    try:
        forward() if forward is not None else model(input_ids)
    finally:
        for h in hooks:
            h.remove()
    return stats


def block_weights(model: nn.Module) -> List[torch.Tensor]:
    """Each block's matrices, flattened into one fp32 host copy (norm gains left out)."""
    return [
        torch.cat([p.detach().float().flatten().cpu() for p in b.parameters() if p.ndim >= 2]) for b in model.layers
    ]


class Validator:
    """Every trainer.eval_interval steps and at the end: validation loss, perplexity and bits per byte, activation RMS
    (hooks on one batch only), each block's weight change if asked, and a sample."""

    def __init__(self, cfg: TrainConfig, parts: Parts, data, windows: Windows, info: D.DistInfo, state: RunState):
        self.cfg, self.parts, self.data, self.windows, self.info, self.state = cfg, parts, data, windows, info, state
        self.weights = block_weights(parts.raw_model) if cfg.trainer.weight_change else None
        if self._samples():  # read once: a data cache deleted mid-run must not end the run at its next sample
            self.tokenizer, self.eos = data.tokenizer(), read_special_tokens(data.dir)["eos"]
        self.every_for = (None, None)  # (max_steps, its interval): re-derived only when a plan moves the end

    def should_validate(self, step: int) -> bool:
        state = self.state
        if self.every_for[0] != state.max_steps:
            self.every_for = (state.max_steps, self.cfg.trainer.eval_every(state.max_steps))
        return step % self.every_for[1] == 0 or step == min(state.max_steps, state.stop_at or state.max_steps)

    def time_one(self) -> float:
        """Seconds one validation takes (a time budget's probe): two batches timed after one that compiles, scaled up."""
        t, parts = self.cfg.trainer, self.parts
        self.parts.compute_loss.eval()
        timed = []
        for batch in itertools.islice(self.windows.batches(t.micro_batch_size), 3):
            start = time.time()
            score(parts.compute_loss, batch, t.micro_batch_size, self.info.device, parts.autocast)[0].item()
            timed.append(time.time() - start)
        parts.compute_loss.train()
        seconds = -(-len(self.windows) // t.micro_batch_size) * sum(timed[1:]) / max(len(timed) - 1, 1)
        for extra, wanted in ((self.activation_rms, t.activation_rms), (self.sample, self._samples())):
            if wanted:
                start = time.time()
                extra()
                seconds += time.time() - start
        return seconds

    def _samples(self) -> bool:
        return self.cfg.trainer.sample_tokens > 0 and self.parts.parallel != "fsdp" and self.info.is_main

    def validate(self, log: Logger) -> dict:
        t, parts = self.cfg.trainer, self.parts
        ev = evaluate(parts.compute_loss, self.windows, t.micro_batch_size, parts.autocast, self.data.meta, self.info)
        if t.activation_rms:  # every rank runs it: under FSDP the forward has collectives
            ev["act_rms"] = self.activation_rms()
        if t.weight_change:  # |W - W_prev| / |W_prev| of each block since the last evaluation
            now = block_weights(parts.raw_model)
            ev["weight_change"] = [float((b - a).norm() / a.norm().clamp_min(1e-30)) for a, b in zip(self.weights, now)]
            self.weights = now
        log.log_eval(self.state.step, self.state.tokens_seen, ev)
        if self._samples():
            log.write(self.sample())
        return ev

    @torch.no_grad()
    def activation_rms(self) -> dict:
        """Through the uncompiled loss module: hooks inside a compiled graph would force a recompile."""
        first = next(self.windows.batches(self.cfg.trainer.micro_batch_size))
        inputs, targets = first.inputs.to(self.info.device), first.targets.to(self.info.device)
        self.parts.loss_module.eval()
        with self.parts.autocast():
            rms = activation_rms(self.parts.raw_model, inputs, lambda: self.parts.loss_module(inputs, targets))
        self.parts.loss_module.train()
        return rms

    def sample(self) -> str:
        """A sample from trainer.sample_prompt as scripts/generate.py makes it, seeded apart from the training RNG."""
        from model.generate import SAMPLING, generate

        t, model = self.cfg.trainer, self.parts.raw_model
        model.eval()
        with self.parts.autocast():
            text = generate(
                model,
                self.tokenizer,
                [t.sample_prompt],
                max_new_tokens=t.sample_tokens,
                **SAMPLING,
                seed=self.cfg.seed,
                eos_token=self.eos,
            )[0]
        model.train()
        return "---- sample ----\n" + t.sample_prompt + text + "\n----------------"


# ---- the loop --------------------------------------------------------------------------------------------------------


@dataclass
class RunSpec:
    """What train.py resolved: the typed config, where the run lives, and what it resumes or starts from."""

    cfg: TrainConfig
    run_dir: Path
    config_yaml: str  # the resolved config, saved next to every checkpoint
    resume: Optional[Resume] = None
    multirun: bool = False  # one job of a `-m` sweep
    init: Optional[InitFrom] = None
    data_change: Optional[dict] = None  # a resume on other data (resume_changed_data=true): state.json records it


@dataclass
class Outcome:
    state: RunState
    last_eval: Optional[dict]
    signum: Optional[int]  # the signal that stopped the run (exit status 128 + signum)
    checkpoint: Optional[Path]
    tokens_run: int  # trained by this process
    wall_s: float  # this process's loop, evaluations and checkpoints included
    limit: str = ""  # the setting that ended the run when trainer.max_steps / max_epochs did (length_limit)


def train(run: RunSpec, info: D.DistInfo, data) -> Outcome:
    cfg, say = run.cfg, say_for(info)
    parts, t = build(cfg, info, say, run.resume, run.init), cfg.trainer
    tokens_per_step = t.micro_batch_size * t.seq_len * t.grad_accum_steps * info.world_size
    max_steps = planned_steps(cfg, data.meta["train_tokens"], tokens_per_step)  # None: the time budget alone
    limit = length_limit(cfg, data.meta["train_tokens"], tokens_per_step)
    if run.resume:
        state = run.resume.restore(
            parts.raw_model, parts.optimizers, parts.precision, cfg, max_steps, info, say, run.run_dir
        )
        if info.is_main:
            rewind_metrics(run.run_dir, state.step)  # the rows after it are logged again
        state.data_changes += [run.data_change] if run.data_change else []
    else:
        state = RunState(
            seed=cfg.seed,
            sampling=cfg.data.sampling,
            world_size=info.world_size,
            max_steps=max_steps or 0,
            stop_at=t.stop_at_step,
            precision=parts.precision,
            machine=D.compute_identity(info.device),
        )
    state.data = data_identity(data.meta, data.dir)
    if t.time_budget:
        TimeBudget.start_plans(state, t.time_budget, max_steps, limit)
    tokens_before, (batches, windows) = state.tokens_seen, data_views(cfg, data, info)
    peak = peak_flops(info.device, parts.precision, t.peak_tflops)
    say(
        header(
            cfg,
            run.run_dir,
            state,
            parts.raw_model,
            data,
            info,
            tokens_per_step,
            parts.precision,
            parts.notes,
            parts.parallel,
            peak,
            run.resume,
            run.init,
        )
    )
    step = TrainStep(
        parts.compute_loss,
        batches,
        parts.optimizers,
        parts.autocast,
        t.grad_accum_steps,
        cfg.optim.grad_clip,
        info.device,
        t.skip_nonfinite_steps,
    )
    checkpointer = Checkpointer(
        run.run_dir,
        parts.raw_model,
        parts.optimizers,
        data.tokenizer_path,
        cfg.model,
        run.config_yaml,
        t.keep_last,
        info,
        state,
        say,
    )
    log = Logger(
        run.run_dir,
        cfg,
        run.config_yaml,
        info,
        state,
        parts.compute_loss,
        tokens_per_step,
        parts.raw_model.flops_per_token(t.seq_len),
        peak[0],
        epoch_tokens(cfg, data.meta["train_tokens"]),
        data.meta["train_tokens"],
    )
    validator = Validator(cfg, parts, data, windows, info, state)
    stop, last_eval, signum = D.StopFlag(), None, None
    state.started = t0 = clock()
    budget = (
        TimeBudget(state, t, info, tokens_per_step, log, validator.time_one, checkpointer.time_one, max_steps, limit)
        if t.time_budget
        else None
    )
    parts.loss_module.train()
    if parts.compute_loss is not parts.loss_module:
        say(
            "compile: the first training step and the first eval compile model + loss (up to a minute or two on a "
            "CPU); the progress bar waits meanwhile"
        )
    try:
        while True:
            # A signal may reach one rank only, or the ranks a moment apart: the max over ranks stops them together.
            signum = stop.signum if info.world_size == 1 else D.agree_max([stop.signum or 0], info)[0] or None
            if signum is not None or state.step >= min(state.max_steps, state.stop_at or state.max_steps):
                break
            lr = apply_schedule(parts.optimizers, state.step, cfg.optim, state.max_steps, state.plans)
            loss, grad_norm = step(state.step)
            state.step, state.tokens_seen = state.step + 1, state.tokens_seen + tokens_per_step
            log.step_done(loss)
            if budget is not None:  # plans state.max_steps from the speed measured since its last plan
                budget.after_step(validator.should_validate(state.step))
            end = min(state.max_steps, state.stop_at or state.max_steps)
            logging, evaluating = log.should_log(state.step), validator.should_validate(state.step)
            saving = state.step % t.ckpt_interval == 0 or state.step == end  # early stopping may add one below
            if logging or evaluating or saving:  # never evaluate or save past a bad step
                record = step.guard.check(state.step, checkpointer.last_good)
                state.skipped_steps += record["skipped"]
                log.note_skipped(record)
            if logging:
                log.log_train(grad_norm, lr)
            if evaluating:
                with log.clock.paused("eval"):  # evaluation time is not training throughput
                    last_eval = validator.validate(log)
                    saving = keep_best_or_stop(last_eval, state, t, checkpointer, log) or saving
            if saving:
                with log.clock.paused("save"):
                    checkpointer.save()
        if signum is not None and checkpointer.saved_step != state.step:  # not twice if it just saved
            checkpointer.save()
    except RuntimeError as e:
        if gone := D.peer_lost(e, info):  # a rank died: say so, not gloo's "Connection reset by peer" traceback
            stop.peer_lost()
            raise D.PeerLost(
                f"rank {info.rank} lost contact with the other ranks ({gone}): another process of this "
                f"torchrun job stopped (killed, or ended by an error of its own, which its line names); {_last_checkpoint(checkpointer)}"
            ) from None
        raise
    finally:
        log.close()
        stop.restore()
    if signum is not None:
        say(
            f"\n{signal.Signals(signum).name}: checkpoint saved at step {state.step}: {checkpointer.last_path}\n"
            f"resume with: python train.py resume={run.run_dir}"
        )
    return Outcome(
        state,
        last_eval,
        signum,
        checkpointer.last_path,
        state.tokens_seen - tokens_before,
        clock() - t0,
        limit if max_steps is not None and state.step == max_steps else "",
    )


def _last_checkpoint(checkpointer: Checkpointer) -> str:
    last = checkpointer.last_good()
    return f"the last checkpoint, {last}, is intact: resume from it" if last else "no checkpoint was written yet"


def keep_best_or_stop(ev: dict, state: RunState, trainer, checkpointer: Checkpointer, log: Logger) -> bool:
    """A new lowest bpb becomes checkpoints/best (trainer.keep_best); trainer.early_stopping evaluations in a row
    without one end the run here. Whether they did (the step is then saved as the run's last)."""
    if state.improves_best(ev["val_bpb"]) and trainer.keep_best:  # the best is tracked either way
        checkpointer.save_best()
    if trainer.early_stopping and state.evals_since_best >= trainer.early_stopping:
        state.stopped_early, state.stop_at = True, state.step
        log.write(
            f"step {state.step}: stopping early — no lower validation bpb in {state.evals_since_best} "
            f"evaluations (trainer.early_stopping); the best, {state.best_val_bpb:.4f} at step "
            f"{state.best_step}, is checkpoints/best"
        )
        return True
    return False
