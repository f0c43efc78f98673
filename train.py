"""Train minillama: `python train.py [overrides]` — Hydra config in, checkpoints and metrics out.

Exit status: 0 finished (or stopped at trainer.stop_at_step), 1 an error (one `error:` line), 128 + signal when a
signal stopped it after saving a checkpoint (130 Ctrl-C, 143 SIGTERM).
"""

import contextlib
import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig

from data import SourceGone, prepare
from training import distributed as D
from training.checkpoint import (
    CHECKPOINTS,
    CONFIG,
    claim_for_run,
    clean_partial_checkpoints,
    data_identity,
    discard_if_unused,
)
from training.cli import (
    ConfigError,
    check_override_keys,
    check_same_config,
    keep_edited_config,
    register_configs,
    resolve_config,
    sigterm_interrupts,
)
from training.log import summary, wandb_mode
from training.loop import RunSpec, train


class JobFailed(CompactHydraException):
    """A multirun job's one-line error: Hydra records it, runs the other jobs, then reports it."""


def run(dict_cfg: DictConfig, info: D.DistInfo) -> float:
    resolved = resolve_config(dict_cfg)
    cfg, resume = resolved.cfg, resolved.resume
    wandb_mode(cfg.logger.wandb)  # online without a key: one line now, never a login prompt later
    say = print if info.is_main else (lambda *a, **k: None)
    # Every rank prepares before joining the group, so no collective timeout runs while a corpus is tokenized;
    # prepare() lets one process build at a time, the others then find the cache.
    data, change = prepare_for(cfg, resume, {} if info.is_main else {"log": lambda *a: None}, say)
    D.join(info, cfg.trainer.dist_timeout_s)
    check_same_config(resolved.config_yaml, info)
    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    run_dir, claim = claim_for_run(hydra_dir, resume, info, lambda text: say(text, file=sys.stderr))
    try:
        if info.is_main:
            for stray in clean_partial_checkpoints(run_dir / CHECKPOINTS):  # a kill or a double Ctrl-C mid-save
                print(f"removed a half-written checkpoint: {stray}", file=sys.stderr)
            if resume is not None and (edited := keep_edited_config(run_dir, resume.path)):
                print(edited, file=sys.stderr)
            (run_dir / CONFIG).write_text(resolved.config_yaml)
        multirun = HydraConfig.get().mode == RunMode.MULTIRUN
        spec = RunSpec(cfg, run_dir, resolved.config_yaml, resume, multirun, resolved.init, change)
        outcome = train(spec, info, data)
    finally:
        if claim is not None:
            claim.release()
    if outcome.signum is not None:
        if spec.multirun:  # Hydra's launcher would start the next job as soon as this one returns
            say(f"{signal.Signals(outcome.signum).name}: sweep stopped; the jobs after this one were not started")
        sys.exit(128 + outcome.signum)
    state = outcome.state
    if state.step < state.max_steps and not state.stopped_early:
        say(f"stopped at trainer.stop_at_step={state.step}; continue with: python train.py resume={run_dir}")
    elif outcome.last_eval is not None:
        say(summary(outcome, run_dir, info.device))
    return outcome.last_eval["val_loss"] if outcome.last_eval else float("nan")


def prepare_for(cfg, resume, quiet: dict, say):
    """(the run's data, a data change a resume accepted or None). A resume trains on the tokens its checkpoint did:
    compared by their digests (another data.path holding the same corpus is the same data); a corpus that moved or
    went away resumes from the token cache it trained on, while that is intact."""
    try:
        data = prepare(cfg.data, seq_len=cfg.trainer.seq_len, model_vocab_size=cfg.model.vocab_size, **quiet)
    except SourceGone as e:
        if resume is None or (data := resume.cached_data(cfg.data.cache_dir)) is None:
            raise
        say(f"data: {e}; resuming from the token cache the run trained on, {data.dir}", file=sys.stderr)
    if resume is None:
        return data, None
    return data, resume.check_data(data_identity(data.meta, data.dir), cfg.resume_changed_data)


register_configs()


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(dict_cfg: DictConfig) -> float:
    info = None
    sigterm_interrupts()  # the loop's own handler takes over while it trains, and gives this one back
    try:
        info = D.process_info(dict_cfg.trainer.device)
        return run(dict_cfg, info)
    except D.StoppedNow as e:  # a second Ctrl-C / SIGTERM: no checkpoint, no traceback
        print(
            f"\n{e}: stopped at once without saving; the last checkpoint is kept, and a half-written one is removed "
            "at the next start",
            file=sys.stderr,
        )
        sys.exit(128 + e.signum)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM before the loop's handler (data preparation, compile)
        signum = getattr(e, "signum", signal.SIGINT)
        print(
            f"\n{signal.Signals(signum).name}: interrupted before training started; nothing was saved", file=sys.stderr
        )
        sys.exit(128 + signum)
    except ValueError as e:  # DataError, CheckpointError, ConfigError, NonFiniteLoss, … included
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        # Another rank's line would be glued to rank 0's progress bar on the shared terminal: a line of its own.
        print(f"{'' if info is None or info.is_main else chr(10)}error: {e}", file=sys.stderr)
        with contextlib.suppress(Exception):
            discard_if_unused(Path(HydraConfig.get().runtime.output_dir), failed_start=True)  # nothing left behind
        if HydraConfig.get().mode == RunMode.MULTIRUN and (info is None or info.world_size == 1):
            # One failed cell (a diverged variant) must not cancel a sweep: Hydra records it and runs the rest. Not
            # under torchrun: a rank moving on to the next job would leave the others waiting in a collective.
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
