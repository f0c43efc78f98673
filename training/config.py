"""Typed schemas of the training config: Hydra composes YAML onto these, train.py hands them out."""

from dataclasses import dataclass, field
from typing import List, Optional

from data.sources import DataConfig
from model.config import ModelConfig


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for everything else)
    lr: float = 3e-3  # the peak; Muon uses it too unless muon_lr is set (see training/optim.py)
    min_lr: float = 3e-4  # the schedule decays to this, not to zero
    schedule: str = "cosine"  # cosine | wsd (warmup, stable at lr, 1-sqrt decay to min_lr at the end)
    warmup_steps: int = 100
    decay_fraction: float = 0.2  # wsd: the last fraction of trainer.max_steps spent decaying
    weight_decay: float = 0.1  # applied to matrices only; norms, biases and embeddings get 0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    impl: str = "auto"  # AdamW kernel: auto | fused | foreach | plain
    muon_lr: Optional[float] = None  # null: optim.lr (Muon's update RMS is matched to AdamW's)
    muon_momentum: float = 0.95  # Nesterov momentum of Muon
    muon_ns_steps: int = 5  # Newton-Schulz iterations that orthogonalise each update
    muon_ns_dtype: str = "auto"  # auto (bf16 where its matmuls run in hardware, else fp32) | bf16 | fp32
    # μP's AdamW lr for the blocks' matrices is lr × m^-exponent: 1 is μP's 1/m (Table 3); another value is an arm of
    # docs/mup.md's width-512 experiment. Unused under sp and by Muon (its own 1/sqrt(m), optim.py).
    mup_hidden_lr_exponent: float = 1.0

    def __post_init__(self):
        """Fail at composition, naming the field and what would be right."""
        for key, choices in (
            ("name", OPTIMIZERS),
            ("schedule", SCHEDULES),
            ("impl", ADAMW_IMPLS),
            ("muon_ns_dtype", ("auto", "bf16", "fp32")),
        ):
            value = getattr(self, key)
            _require(value in choices, f"optim.{key}={value!r} is unknown; choose {_any(choices)}")
        _require(self.lr > 0, f"optim.lr={self.lr} must be > 0 (e.g. 3e-3)")
        _require(0 <= self.min_lr <= self.lr, f"optim.min_lr={self.min_lr} must be between 0 and optim.lr={self.lr}")
        for key in ("warmup_steps", "weight_decay", "grad_clip"):
            _require(getattr(self, key) >= 0, f"optim.{key}={getattr(self, key)} must be >= 0")
        _require(0 < self.decay_fraction <= 1, f"optim.decay_fraction={self.decay_fraction} must be in (0, 1]")
        for key in ("beta1", "beta2", "muon_momentum"):
            _require(0 <= getattr(self, key) < 1, f"optim.{key}={getattr(self, key)} must be in [0, 1)")
        _require(self.eps > 0, f"optim.eps={self.eps} must be > 0")
        _require(self.muon_lr is None or self.muon_lr > 0, f"optim.muon_lr={self.muon_lr} must be > 0, or null")
        _require(1 <= self.muon_ns_steps < 100, f"optim.muon_ns_steps={self.muon_ns_steps} must be in [1, 99]")


OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")
ADAMW_IMPLS = ("auto", "fused", "foreach", "plain")


EVALS_PER_RUN = 10  # trainer.eval_interval=null: at least this many evaluations per run (10 to 25)


@dataclass
class TrainerConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    precision: str = "auto"  # auto (bf16 where its matmuls are fast, else fp32) | bf16 (autocast) | fp32
    tf32: bool = True  # CUDA: fp32 matmuls on TF32 tensor cores (fp32 range, 10-bit mantissa); false = exact fp32
    compile: str = "auto"  # auto (CUDA, or CPU with a working inductor toolchain) | true | false
    # The cross-entropy in chunks that never hold a micro-batch's full fp32 logits (loop.py CausalLMLoss): auto (above
    # 2^26 logits, e.g. 16 x 1024 tokens at a 4k vocab) | true | false. A memory setting: at the CPU default it is slower.
    chunked_loss: str = "auto"
    # The run's length: it ends at the first of max_steps, max_epochs and time_budget reached (those set; one at
    # least). The schedule (warmup + cosine) ends there too. docs/training.md: the rule for the three.
    max_steps: Optional[int] = 1000
    # Minutes of training loop (compile, evals and checkpoints included): the run times its first steps
    # and plans its end to fit (training/budget.py), at most what max_steps / max_epochs allow.
    time_budget: Optional[float] = None
    # Stop early at this step with a checkpoint, as if interrupted (e.g. to fit a job time limit);
    # `resume=` then continues the same schedule to max_steps.
    stop_at_step: Optional[int] = None
    micro_batch_size: int = 16
    seq_len: int = 256
    grad_accum_steps: int = 1
    eval_interval: Optional[int] = None  # steps between evaluations; null: sized to the run (eval_every)
    eval_windows: str = "64"  # validation windows per eval, or "all": the whole split, every token once
    log_interval: int = 10
    ckpt_interval: int = 500
    keep_last: int = 3  # step checkpoints kept (the newest finite one is never pruned); 0 keeps all
    keep_best: bool = True  # also keep checkpoints/best, the lowest validation bpb so far
    # Stop once this many evaluations in a row have not lowered the validation bpb (checkpoints/best holds
    # the lowest; the summary names it); null = train to the end.
    early_stopping: Optional[int] = None
    # At most this many epochs: under data.sampling=epochs that many passes over every window, ceil(epochs ×
    # windows per epoch ÷ windows per step) steps; under random, epoch-equivalents of windows drawn with
    # replacement, ceil(epochs × train tokens ÷ tokens per step).
    max_epochs: Optional[float] = None
    # Non-finite loss or gradient: the update is always skipped; 0 stops the run at the first one,
    # N > 0 tolerates up to N-1 in a row (counted and logged) and stops at the N-th (OLMo's spike guard).
    skip_nonfinite_steps: int = 0
    epoch_warning: float = 4.0  # warn once past this many epochs (epoch-equivalents under random sampling)
    num_threads: Optional[int] = None  # torch CPU threads; None = torch's default
    parallel: str = "auto"  # auto (ddp if world size > 1) | none | ddp | fsdp
    dist_timeout_s: int = 300  # a rank that stops answering fails the run instead of hanging it
    peak_tflops: Optional[float] = None  # MFU denominator; None = a GPU's data sheet, or one quick probe
    sample_tokens: int = 0  # > 0: print a sample of this many tokens at each eval
    sample_prompt: str = ""  # '' starts a new document, as after <|eos|>: a prompt every corpus knows
    activation_rms: bool = True  # log per-layer RMS at each eval: residual stream, norms' outputs, attention logits
    # log each block's relative weight change since the previous eval (or since the run started or resumed):
    # |W - W_prev| / |W_prev| over the block's matrices; keeps a copy of the blocks' weights in host memory
    weight_change: bool = False

    def __post_init__(self):
        """Fail at composition, naming the field — not after data preparation, not in torch's words."""
        for key in (
            "micro_batch_size",
            "seq_len",
            "grad_accum_steps",
            "log_interval",
            "ckpt_interval",
            "dist_timeout_s",
        ):
            _require(getattr(self, key) > 0, f"trainer.{key}={getattr(self, key)} must be a positive integer")
        for key in ("max_steps", "eval_interval"):
            value = getattr(self, key)
            _require(value is None or value > 0, f"trainer.{key}={value} must be a positive integer, or null")
        for key in ("keep_last", "skip_nonfinite_steps", "sample_tokens"):
            _require(getattr(self, key) >= 0, f"trainer.{key}={getattr(self, key)} must be >= 0")
        for key in ("stop_at_step", "num_threads", "peak_tflops", "time_budget", "early_stopping", "max_epochs"):
            value = getattr(self, key)
            _require(value is None or value > 0, f"trainer.{key}={value} must be > 0, or null")
        _require(self.epoch_warning > 0, f"trainer.epoch_warning={self.epoch_warning} must be > 0")
        self.compile, self.chunked_loss = str(self.compile).lower(), str(self.chunked_loss).lower()  # YAML's true
        for key, choices in (
            ("precision", ("auto", "bf16", "fp32")),
            ("parallel", ("auto", "none", "ddp", "fsdp")),
            ("compile", ("auto", "true", "false")),
            ("chunked_loss", ("auto", "true", "false")),
        ):
            value = getattr(self, key)
            _require(value in choices, f"trainer.{key}={value!r} is unknown; choose {_any(choices)}")
        _require(
            not (self.weight_change and self.parallel == "fsdp"),
            "trainer.weight_change=true needs whole weights on each rank; use trainer.parallel=ddp or none",
        )
        _require(
            any(getattr(self, key) for key in ("max_steps", "max_epochs", "time_budget")),
            "trainer.max_steps, trainer.max_epochs and trainer.time_budget are all null: the run has no end; "
            "set one of them",
        )
        self.eval_windows = str(self.eval_windows).lower()
        _require(
            self.eval_windows == "all" or (self.eval_windows.isdigit() and int(self.eval_windows) > 0),
            f"trainer.eval_windows={self.eval_windows!r} must be a positive number of windows or 'all'",
        )

    def eval_every(self, max_steps: int) -> int:
        """Steps between evaluations for a run of `max_steps`: trainer.eval_interval, or sized to the run — the
        largest of 1, 2, 5 × 10^k steps with at least EVALS_PER_RUN evaluations, so the best checkpoint is found
        within a tenth of the run; a new plan of a time budget re-derives it."""
        if self.eval_interval:
            return self.eval_interval
        target, every = max(max_steps / EVALS_PER_RUN, 1), 1
        for power in range(19):
            for nice in (1, 2, 5):
                if nice * 10**power <= target:
                    every = nice * 10**power
        return every

    @property
    def num_eval_windows(self) -> Optional[int]:
        """How many validation windows each eval scores; None = the whole split."""
        return None if self.eval_windows == "all" else int(self.eval_windows)


@dataclass
class LoggerConfig:
    wandb: str = "auto"  # auto (online with an API key, else offline) | online | offline | disabled
    project: str = "minillama"
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)


# OmegaConf's marker for "must be filled in by the config groups": the groups' YAML is merged onto
# the class defaults, so derived fields (intermediate_size, n_kv_heads) stay unresolved until
# train.py builds the dataclasses and their __post_init__ runs.
MISSING = "???"


@dataclass
class TrainConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    seed: int = 0
    run_name: str = "run"
    resume: Optional[str] = None  # checkpoint dir | run dir | latest | best: continue that run
    init_from: Optional[str] = None  # the same, or a Hugging Face Llama dir: a new run from its weights
    verify_checkpoint: bool = True  # resume: hash every file against manifest.json first (~1 s per GB)
    resume_changed_data: bool = False  # resume onto other tokens than the run trained on (state.json records it)
    outputs_dir: str = "outputs"

    def __post_init__(self):
        # numpy's SeedSequence (data order, per-rank dropout) takes non-negative integers only.
        _require(0 <= self.seed < 2**63, f"seed={self.seed} must be an integer from 0 to 2**63 - 1")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _any(choices: tuple) -> str:
    return f"{', '.join(choices[:-1])} or {choices[-1]}"
