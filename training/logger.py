"""Where metrics go: metrics.jsonl in the run directory (always, training/metrics.py) and wandb (online,
offline or off)."""
import netrc
import os
import sys
from pathlib import Path
from typing import Optional

from training.config import LoggerConfig
from training.metrics import MetricsFile


def wandb_mode(requested: str) -> tuple:
    """(mode, warning or None). `auto` goes online only when an API key is configured, so a
    fresh machine never blocks on wandb's login prompt or on a network it cannot reach."""
    if requested not in ("auto", "online", "offline", "disabled"):
        raise ValueError(f"logger.wandb={requested!r} is unknown; choose auto, online, offline or disabled")
    if requested != "auto":
        if requested == "online" and not _has_wandb_key():
            raise ValueError("logger.wandb=online but no API key is configured; run `wandb login` or set "
                             "WANDB_API_KEY, or use logger.wandb=offline")
        return requested, None
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "online"):
        return os.environ["WANDB_MODE"], None
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


class RunLogger:
    """Rank 0 writes; other ranks get a logger whose methods do nothing."""

    def __init__(self, run_dir: Path, cfg: LoggerConfig, run_name: str, config: dict, enabled: bool,
                 resume_step: Optional[int] = None):
        self.enabled = enabled
        self.wandb = None
        if not enabled:
            return
        self.metrics = MetricsFile(run_dir, resume_step)
        mode, warning = wandb_mode(cfg.wandb)
        if warning:
            print(warning, file=sys.stderr)
        if mode != "disabled":
            import wandb
            self.wandb = wandb.init(project=cfg.project, name=run_name, group=cfg.group, tags=list(cfg.tags),
                                    config=config, dir=str(run_dir), mode=mode, resume="allow",
                                    id=_wandb_id(run_dir), settings=wandb.Settings(init_timeout=60, silent=True))

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        row = self.metrics.append(row)
        if self.wandb is not None:
            self.wandb.log(wandb_values(row), step=row["step"])

    def close(self) -> None:
        if not self.enabled:
            return
        self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()


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
