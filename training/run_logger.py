"""Where metrics go: metrics.jsonl in the run directory (always) and wandb (online, offline or off)."""
import json
import netrc
import os
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional

from training.config import LoggerConfig
from training.write_errors import WriteError, write_error_cause


class MetricsError(ValueError):
    """metrics.jsonl is corrupt before its last line (a cut-off last line is only a warning)."""


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
        self.path = Path(run_dir) / "metrics.jsonl"
        try:
            if resume_step is not None:
                self._truncate_after(resume_step)  # rows past the checkpoint will be logged again
            self.file = open(self.path, "a", buffering=1)
        except OSError as e:
            raise WriteError(f"cannot write metrics: {write_error_cause(e, self.path)}") from e
        mode, warning = wandb_mode(cfg.wandb)
        if warning:
            print(warning, file=sys.stderr)
        if mode != "disabled":
            import wandb
            self.wandb = wandb.init(project=cfg.project, name=run_name, group=cfg.group, tags=list(cfg.tags),
                                    config=config, dir=str(run_dir), mode=mode, resume="allow",
                                    id=_wandb_id(run_dir), settings=wandb.Settings(init_timeout=60, silent=True))

    def _truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        rows = [row for row in read_metrics(self.path) if row.get("step", 0) <= step]
        # Rewritten under a temp name and renamed: a kill now cannot lose the rows it keeps.
        temp = self.path.with_name(self.path.name + ".tmp")
        temp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(temp, self.path)

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        row = {"time": time.time(), **row}
        try:
            self.file.write(json.dumps(row) + "\n")
        except OSError as e:  # full disk, quota, …: one line, not a traceback from inside the loop
            raise WriteError(f"cannot write metrics: {write_error_cause(e, self.path)}") from e
        if self.wandb is not None:
            self.wandb.log(wandb_values(row), step=row["step"])

    def close(self) -> None:
        if not self.enabled:
            return
        self.file.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(path: Path, warn: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> List[dict]:
    """The rows of a metrics.jsonl. A kill -9 can cut the last line mid-JSON: that line is dropped with
    a warning (its step is logged again on resume). A broken line before the last is corruption: an error."""
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
            raise MetricsError(f"{path} line {n} is not a JSON object ({line[:40]!r}) but more rows follow it; "
                               "the file is corrupt: fix or delete that line, then resume")
    return rows


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
