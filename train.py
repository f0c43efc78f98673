"""Train minillama: `python train.py [overrides]` — Hydra config in, checkpoints and metrics out.

Exit status: 0 finished (or stopped at trainer.stop_at_step), 1 an error (one `error:` line),
128 + signal when a signal stopped it after saving a checkpoint (130 Ctrl-C, 143 SIGTERM).
"""
import contextlib
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig

from cli.config import ConfigError, check_override_keys, register_configs, resolve_config
from data import prepare
from training import report
from training.checkpoint import clean_partial_checkpoints
from training.logger import wandb_mode
from training.loop import RunSpec, train
from training.runtime import distributed as D
from training.runtime import run_dir as R
from training.runtime.run_files import RunFiles
from training.runtime.signals import StoppedNow, exit_status, signal_name


class JobFailed(CompactHydraException):
    """A multirun job's one-line error: Hydra records it, runs the other jobs, then reports it."""


def run(dict_cfg: DictConfig, info: D.DistInfo) -> float:
    resolved = resolve_config(dict_cfg)
    cfg, config_yaml, resume = resolved.cfg, resolved.config_yaml, resolved.resume
    wandb_mode(cfg.logger.wandb)  # online without a key: one line now, never a login prompt later
    # Every rank prepares before joining the process group, so no collective timeout runs while a big
    # corpus is tokenized; prepare() lets one process build at a time, the others then find the cache.
    quiet = {} if info.is_main else {"log": lambda *a: None}
    data = prepare(cfg.data, seq_len=cfg.trainer.seq_len, model_vocab_size=cfg.model.vocab_size, **quiet)
    if resume is not None:
        resume.check_tokenizer(data.tokenizer_path)  # same data (the architecture: resolve_config)
    D.join(info, cfg.trainer.dist_timeout_s)
    run_dir, claim = R.claim_for_run(Path(HydraConfig.get().runtime.output_dir), resume and resume.run_dir, info)
    try:
        if info.is_main:
            files = RunFiles(run_dir)
            for stray in clean_partial_checkpoints(files.checkpoints):  # a kill or a double Ctrl-C mid-save
                print(f"removed a half-written checkpoint: {stray}", file=sys.stderr)
            files.write_config(config_yaml)
        spec = RunSpec(cfg, run_dir, config_yaml, resume, HydraConfig.get().mode == RunMode.MULTIRUN,
                       resolved.init)
        outcome = train(spec, info, data)
    finally:
        if claim is not None:
            claim.release()
    say = print if info.is_main else (lambda *a, **k: None)
    if outcome.signum is not None:
        if spec.multirun:  # Hydra's launcher would start the next job as soon as this one returns
            say(f"{signal_name(outcome.signum)}: sweep stopped; the jobs after this one were not started")
        sys.exit(exit_status(outcome.signum))
    if outcome.state.step < outcome.state.max_steps and not outcome.state.stopped_early:
        say(f"stopped at trainer.stop_at_step={outcome.state.step}; continue with: python train.py resume={run_dir}")
    elif outcome.last_eval is not None:
        say(report.summary(outcome, run_dir, info.device))
    return outcome.last_eval["val_loss"] if outcome.last_eval else float("nan")


register_configs()


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(dict_cfg: DictConfig) -> float:
    info = None
    try:
        info = D.process_info(dict_cfg.trainer.device)
        return run(dict_cfg, info)
    except StoppedNow as e:  # a second Ctrl-C / SIGTERM: no checkpoint, no traceback
        print(f"\n{e}: stopped at once without saving; the last checkpoint is kept, and a half-written one "
              "is removed at the next start", file=sys.stderr)
        sys.exit(exit_status(e.signum))
    except KeyboardInterrupt:  # Ctrl-C before the loop installed its handler (data preparation, compile)
        print("\nSIGINT: interrupted before training started; nothing was saved", file=sys.stderr)
        sys.exit(130)
    except ValueError as e:  # DataError, CheckpointError, ConfigError, NonFiniteLoss, … included
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        # Another rank's line would be glued to rank 0's progress bar on the shared terminal: start a line of its own.
        print(f"{'' if info is None or info.is_main else chr(10)}error: {e}", file=sys.stderr)
        with contextlib.suppress(Exception):
            R.discard_if_unused(Path(HydraConfig.get().runtime.output_dir), failed_start=True)  # nothing left
        if HydraConfig.get().mode == RunMode.MULTIRUN and (info is None or info.world_size == 1):
            # One failed cell (e.g. a diverged variant) must not cancel the rest of a sweep: Hydra
            # records it, runs the remaining jobs, then names the failed job and exits 1. Not under
            # torchrun: a rank that moved on to the next job would leave the others waiting in a collective.
            raise JobFailed(str(e)) from None
        sys.exit(1)
    finally:
        D.teardown()


if __name__ == "__main__":
    try:
        check_override_keys(sys.argv[1:])  # a mistyped key: one line here, not Hydra's seven
    except ConfigError as e:
        sys.exit(f"error: {e}")
    main()
