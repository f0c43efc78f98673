"""Typed schemas of the training config: Hydra composes YAML onto these, train.py hands them out."""
from dataclasses import dataclass, field
from typing import List, Optional



from data.config import DataConfig
from model.config import ModelConfig


@dataclass
class OptimConfig:
    lr: float = 3e-3
    min_lr: float = 3e-4  # cosine decays to this, not to zero
    warmup_steps: int = 100
    weight_decay: float = 0.1  # applied to matrices only; norms, biases and embeddings get 0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    impl: str = "auto"  # auto | fused | foreach | plain


@dataclass
class TrainerConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    precision: str = "auto"  # auto (bf16 where its matmuls are fast, else fp32) | bf16 (autocast) | fp32
    compile: bool = False
    max_steps: int = 1000  # the schedule's length (warmup + cosine over these steps)
    # Stop early at this step with a checkpoint, as if interrupted (e.g. to fit a job time limit);
    # `resume=` then continues the same schedule to max_steps.
    stop_at_step: Optional[int] = None
    micro_batch_size: int = 16
    seq_len: int = 256
    grad_accum_steps: int = 1
    eval_interval: int = 200
    eval_windows: int = 64
    log_interval: int = 10
    ckpt_interval: int = 500
    keep_last: int = 3
    num_threads: Optional[int] = None  # torch CPU threads; None = torch's default
    parallel: str = "auto"  # auto (ddp if world size > 1) | none | ddp | fsdp
    dist_timeout_s: int = 300  # a rank that stops answering fails the run instead of hanging it
    peak_tflops: Optional[float] = None  # MFU denominator; None = look up (GPU) or measure (CPU)
    sample_tokens: int = 0  # > 0: print a sample of this many tokens at each eval
    sample_prompt: str = "\n"
    activation_rms: bool = True  # log per-layer residual-stream RMS at each eval


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
    resume: Optional[str] = None  # checkpoint dir | run dir | latest
    outputs_dir: str = "outputs"
