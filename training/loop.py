"""The training loop: build the run, then one loop you can read top to bottom. Each part decides its own
timing (`should_log`, `should_validate`, `should_save`); the loop only asks."""
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from training import report
from training.budget import TimeBudget
from training.build import build, data_views, length_limit, planned_steps
from training.checkpoint import Checkpointer, run_state
from training.checkpoint.run_state import RunState
from training.context import RunContext, RunSpec  # noqa: F401 (RunSpec: train.py's way in)
from training.logger import Logger, say_for
from training.optim import apply_schedule
from training.runtime import distributed as D
from training.runtime.mfu import peak_flops
from training.runtime.signals import StopFlag, signal_name
from training.step import TrainStep
from training.validator import Validator


@dataclass
class Outcome:
    state: RunState  # where the run stands: step, tokens, best validation, skipped steps
    last_eval: Optional[dict]
    signum: Optional[int]  # the signal that stopped the run (exit status 128 + signum)
    checkpoint: Optional[Path]
    tokens_run: int  # trained by this process (a resume counts from its checkpoint)
    wall_s: float  # this process's loop, evals and checkpoints included
    limit: str = ""  # the setting that ended the run when it was trainer.max_steps / max_epochs (build.length_limit)


def train(run: RunSpec, info: D.DistInfo, data) -> Outcome:
    cfg, say = run.cfg, say_for(info)
    parts = build(cfg, info, say, run.resume, run.init)
    tokens_per_step = cfg.trainer.micro_batch_size * cfg.trainer.seq_len * cfg.trainer.grad_accum_steps * info.world_size
    max_steps = planned_steps(cfg, data.meta["train_tokens"], tokens_per_step)  # None: the time budget alone
    limit = length_limit(cfg, data.meta["train_tokens"], tokens_per_step)
    state = run.resume.restore(parts.raw_model, parts.optimizers, parts.precision, cfg, max_steps, info, say) \
        if run.resume else RunState(
        seed=cfg.seed, sampling=cfg.data.sampling, world_size=info.world_size, max_steps=max_steps or 0,
        stop_at=cfg.trainer.stop_at_step, precision=parts.precision)
    tokens_before = state.tokens_seen
    batches, windows = data_views(cfg, data, info)
    peak, peak_source = peak_flops(info.device, parts.precision, cfg.trainer.peak_tflops, cfg.trainer.peak_cache)
    ctx = RunContext(run, info, parts, data, batches, windows, state, tokens_per_step, peak, peak_source)
    if cfg.trainer.time_budget:
        TimeBudget.start_plans(state, cfg.trainer.time_budget, max_steps, limit)
    say(report.header(ctx))
    step, checkpointer, log, validator = TrainStep.for_run(ctx), Checkpointer(ctx), Logger(ctx), Validator(ctx)
    stop, last_eval, signum, t0 = StopFlag(), None, None, run_state.clock()
    state.started = t0
    budget = TimeBudget(ctx, log, validator, checkpointer, max_steps, limit) if cfg.trainer.time_budget else None
    parts.loss_module.train()
    if parts.compute_loss is not parts.loss_module:
        say("compile: the first training step and the first eval compile model + loss (up to a minute or two "
            "on a CPU); the progress bar waits meanwhile")
    try:
        while (signum := agreed_signal(stop, info)) is None and state.step < state.end:
            lr = apply_schedule(parts.optimizers, state.step, cfg.optim, state.max_steps, state.schedule_ends)
            result = step(state.step)
            state.advance(tokens_per_step)
            log.step_done(result.loss)
            if budget is not None:  # plans state.max_steps from the speed measured since its last plan
                budget.after_step()
            if log.should_log(state.step) or validator.should_validate(state.step) or checkpointer.should_save(state.step):
                record = step.guard.check(state.step, checkpointer.last_good())  # never eval or save past a bad step
                state.skipped_steps += record["skipped"]
                log.note_skipped(record)
            if log.should_log(state.step):
                log.log_train(result.grad_norm, lr)
            if validator.should_validate(state.step):
                with log.clock.paused("eval"):  # evaluation time is not training throughput
                    last_eval = validator.validate(log)
                    keep_best_or_stop(last_eval, state, cfg.trainer, checkpointer, log)
            if checkpointer.should_save(state.step):
                with log.clock.paused("save"):
                    checkpointer.save()
        if signum is not None and checkpointer.saved_step != state.step:  # not twice if it just saved
            checkpointer.save()
    except RuntimeError as e:
        gone = D.peer_lost(e, info)
        if gone:  # a rank died: say so, not gloo's "Connection reset by peer" traceback
            stop.peer_lost()
            raise D.PeerLost(f"rank {info.rank} lost contact with the other ranks ({gone}): another process of this "
                             f"torchrun job died or was killed; {_last_checkpoint(checkpointer)}") from None
        raise
    finally:
        log.close()
        stop.restore()
    if signum is not None:
        say(f"\n{signal_name(signum)}: checkpoint saved at step {state.step}: {checkpointer.last_path}\n"
            f"resume with: python train.py resume={run.run_dir}")
    return Outcome(state, last_eval, signum, checkpointer.last_path, state.tokens_seen - tokens_before,
                   run_state.clock() - t0, limit if max_steps is not None and state.step == max_steps else "")


def keep_best_or_stop(ev: dict, state: RunState, trainer, checkpointer: Checkpointer, log: Logger) -> None:
    """The run's policy on a validation: a new lowest bpb becomes checkpoints/best (trainer.keep_best), and
    trainer.early_stopping evaluations in a row without one end the run at this step (saved as its last)."""
    if state.improves_best(ev["val_bpb"]) and trainer.keep_best:  # the best is tracked either way
        checkpointer.save_best()
    if trainer.early_stopping and state.evals_since_best >= trainer.early_stopping:
        state.stop_early()
        log.write(f"step {state.step}: stopping early — no lower validation bpb in {state.evals_since_best} "
                  f"evaluations (trainer.early_stopping); the best, {state.best_val_bpb:.4f} at step "
                  f"{state.best_step}, is checkpoints/best")


def _last_checkpoint(checkpointer: Checkpointer) -> str:
    last = checkpointer.last_good()
    return f"the last checkpoint, {last}, is intact: resume from it" if last else "no checkpoint was written yet"


def agreed_signal(stop: StopFlag, info: D.DistInfo) -> Optional[int]:
    """The signal number every rank stops for, or None. A signal may reach one rank only, or the
    ranks a moment apart: the max over ranks makes them all stop (and save) at the same step."""
    (signum,) = D.agree_max([stop.signum or 0], info)
    return signum or None
