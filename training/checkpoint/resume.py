"""Resuming a run: the checkpoint it continues from, opened once, checked once, restored in one call.

`Resume.open` resolves `resume=` (a checkpoint, a run directory, `latest`, `best`), verifies its files against
the manifest, checks they agree with each other and reads state.json — before any data is prepared.
`restore` then puts back every resumable part — weights, optimizer state, RNG, the RunState (data
position, budget plans, precision, best so far) and the metrics position (metrics.jsonl's rows after the
step go: they are logged again) — and tidies the branch the resume abandons. The checks a resume needs run
once each: the architecture when the config is resolved (`check_fits`), the tokenizer once the data is
prepared (`check_tokenizer`), the data order (data.sampling, windows per step) in `restore`.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from model import ModelConfig
from training.checkpoint.cleanup import move_aside_later_checkpoints
from training.checkpoint.consistency import check_resume_fits, check_resume_tokenizer, open_checkpoint
from training.checkpoint.errors import CheckpointError, first_line
from training.checkpoint.format import run_dir_of
from training.checkpoint.load import load_optimizer_and_rng, read_weights, restore_rng
from training.checkpoint.run_state import UNPLANNED_END, RunState, read_state
from training.checkpoint.state_dicts import load_full_state
from training.metrics import rewind_metrics
from training.optim.schedule import lr_at
from training.runtime import distributed as D
from training.runtime.run_files import RunFiles


@dataclass(frozen=True)
class Resume:
    """A verified, self-consistent checkpoint a run continues from, and its state.json."""
    path: Path
    fields: dict  # state.json, read once
    model: ModelConfig  # model_config.json, checked against the weights, config.yaml and the tokenizer

    @classmethod
    def open(cls, path: str, outputs_dir: str = "outputs", verify: bool = True,
             warn: Callable[[str], None] = lambda message: None) -> "Resume":
        ckpt, model = open_checkpoint(path, outputs_dir, verify, warn)
        try:
            fields = read_state(ckpt)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{ckpt}/state.json is unreadable ({first_line(e)}); resume from an older "
                                  "checkpoint") from None
        return cls(ckpt, fields, model)

    @property
    def step(self) -> int:
        return self.fields["step"]

    @property
    def precision(self) -> str:
        """What the run trained in ('' for a checkpoint written before precision was recorded)."""
        return self.fields.get("precision", "")

    @property
    def run_dir(self) -> Path:
        return run_dir_of(self.path)

    def check_fits(self, run_model: ModelConfig) -> None:
        """The resumed run builds the checkpoint's model (model.* overrides may not change the architecture)."""
        check_resume_fits(self.path, run_model)

    def check_tokenizer(self, data_tokenizer: Path) -> None:
        """The resumed run reads its data with the checkpoint's tokenizer."""
        check_resume_tokenizer(self.path, data_tokenizer)

    def restore(self, raw_model: torch.nn.Module, optimizers: list, precision: str, cfg, max_steps: int,
                info: D.DistInfo, say) -> RunState:
        """Load the weights, optimizer state and RNG into the built run (unwrapped model; `cfg` a TrainConfig);
        the RunState it continues with. `max_steps` is what this config plans (a time budget's plans go on
        instead, if it still has one); `precision` is what this process trains in."""
        state = RunState.from_json(self.fields)
        self._check_data_order(state, cfg, info, say)  # before loading anything: it may refuse
        optim_state, rng = load_optimizer_and_rng(self.path)
        load_full_state(raw_model, optimizers, read_weights(raw_model, self.path), optim_state)
        if not restore_rng(rng, info.rank, info.world_size):  # last: nothing after this may draw from it
            say("warning: the checkpoint holds no RNG state for this world size: dropout draws restart from the seed")
        state.precision = precision  # what this process trains in (state.json says what the run trained in)
        trainer = cfg.trainer
        if not (state.budget_decided and trainer.time_budget):  # a budget's plans go on; else the config's end
            state.max_steps, state.budget_minutes, state.plans = max_steps or UNPLANNED_END, None, []
        if state.stopped_early and trainer.early_stopping and state.evals_since_best >= trainer.early_stopping:
            raise ValueError(f"{self.path} ended its run early at step {state.step} (no lower validation bpb in "
                             f"{state.evals_since_best} evaluations); to train on, resume with "
                             "trainer.early_stopping=null or a larger patience")
        state.stop_at, state.stopped_early = trainer.stop_at_step, False
        if state.step >= state.max_steps:
            what = ("the end its time budget planned" if state.budget_decided else
                    f"trainer.max_steps={trainer.max_steps}" if trainer.max_steps == state.max_steps else
                    f"the end trainer.max_epochs={trainer.max_epochs:g} sets ({state.max_steps} steps)")
            where = "already at" if state.step == state.max_steps else "past"
            raise ValueError(f"{self.path} is at step {state.step}, {where} {what}; pass a larger trainer.max_steps to "
                             "train further (the schedule then stretches to it)")
        moved_end = self._schedule_change(state, cfg.optim)
        if moved_end:
            say(moved_end)
        if info.is_main:  # the branch this resume abandons must not be picked by a later resume or keep_last
            moved = move_aside_later_checkpoints(RunFiles(self.run_dir).checkpoints, state.step)
            if moved:
                say(f"resume: moved {len(moved)} later checkpoint(s) of the abandoned branch to {moved[0].parent}")
            rewind_metrics(self.run_dir, state.step)  # the metrics position: rows past it are logged again
        if state.world_size != info.world_size:
            say(f"warning: resuming a {state.world_size}-process run on {info.world_size}: each step's global "
                f"batch changes with the world size; adjust trainer.micro_batch_size to keep tokens per step")
        state.seed, state.world_size = cfg.seed, info.world_size  # what this process trains with
        return state

    def _check_data_order(self, state: RunState, cfg, info: D.DistInfo, say) -> None:
        """The resumed run continues its run's data order: the same data.sampling (refused otherwise: a default
        that changes must not switch a run's sampler silently), and under epochs the same windows per step, or
        the epoch under way skips or repeats windows (said, as a world-size change is)."""
        if state.sampling != cfg.data.sampling:
            raise ValueError(f"{self.path} drew its batches with data.sampling={state.sampling}, this run with "
                             f"data.sampling={cfg.data.sampling}; resume with data.sampling={state.sampling}, or "
                             f"start a new run from its weights: init_from={self.path}")
        t = cfg.trainer
        tokens_per_step = t.micro_batch_size * t.seq_len * t.grad_accum_steps * info.world_size
        if state.sampling == "epochs" and state.tokens_seen != state.step * tokens_per_step:
            say(f"warning: this data.sampling=epochs run trained {state.tokens_seen:,} tokens in {state.step} steps, "
                f"not {state.step} × {tokens_per_step:,} (this resume's tokens per step): the epoch under way skips "
                "or repeats windows; keep trainer.micro_batch_size × grad_accum_steps × world size to continue its "
                "order exactly")

    def _schedule_change(self, state: RunState, optim) -> str:
        """A line when this resume moves the schedule's end (a new trainer.max_steps): what happens to the learning
        rate where it continues. '' when the end stays, or the checkpoint did not record it."""
        before = self.fields.get("max_steps")
        if not before or before == state.max_steps or state.budget_decided:
            return ""
        old, new = lr_at(state.step, optim, before), lr_at(state.step, optim, state.max_steps)
        change = (f"stays {new:.3g}" if abs(new - old) <= 1e-12 + 1e-6 * old else
                  f"goes from {old:.3g} to {new:.3g} at once" + (" (cosine's curve stretches to the new end; "
                  "optim.schedule=wsd keeps its stable phase)" if optim.schedule == "cosine" else ""))
        return (f"resume: the schedule now ends at step {state.max_steps}, not {before}; the learning rate at "
                f"step {state.step} {change}")
