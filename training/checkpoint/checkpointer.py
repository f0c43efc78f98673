"""The loop's checkpointer: decides when to save, and saves with every rank taking part (FSDP gathers
shards), rank 0 writing, and all ranks learning the outcome.

Refuses non-finite weights (a NaN checkpoint is worse than none: resume would start from it), and
turns a failed write on rank 0 into the same error on every rank, so no rank walks on into the
next step's collectives while another has stopped.
"""
import shutil
import time
from pathlib import Path
from typing import Optional

import torch

from training.checkpoint.errors import NonFiniteCheckpoint
from training.checkpoint.format import BEST, last_good_checkpoint
from training.checkpoint.save import rng_states_of_this_process, save_checkpoint
from training.checkpoint.state_dicts import full_model_state, full_optimizer_state
from training.runtime import distributed as D
from training.runtime.run_files import RunFiles


class Checkpointer:
    """checkpoints/step_N every `interval` steps and at the run's end; checkpoints/best on request."""

    def __init__(self, ctx):  # a training/context.py RunContext
        self.run, self.info, self.state = ctx.run, ctx.info, ctx.state
        self.raw_model, self.optimizers, self.tokenizer_path = ctx.parts.raw_model, ctx.parts.optimizers, ctx.data.tokenizer_path
        self.interval, self.keep_last = ctx.cfg.trainer.ckpt_interval, ctx.cfg.trainer.keep_last
        self.ckpt_root = RunFiles(ctx.run.run_dir).checkpoints
        self.saved_step: Optional[int] = None  # the step of the last step_* checkpoint this run wrote
        self.last_path: Optional[Path] = None

    def should_save(self, step: int) -> bool:
        return step % self.interval == 0 or step == self.state.end

    def save(self) -> Path:
        """checkpoints/step_N: weights, optimizer, RNG and the RunState, written atomically."""
        self.last_path = self._write(self.ckpt_root, self.keep_last)
        self.saved_step = self.state.step
        return self.last_path

    def save_best(self) -> Path:
        """checkpoints/best/step_N: the lowest validation bpb so far. The new one is renamed into place
        before the old one is pruned, so a best checkpoint exists at every moment."""
        return self._write(self.ckpt_root / BEST, keep_last=1)

    def time_one(self) -> float:
        """Seconds one checkpoint takes, by writing one where nothing looks for it (a time budget's probe)."""
        probe = self.ckpt_root / ".budget-probe"
        start = time.time()
        try:
            self._write(probe, keep_last=0)
            return time.time() - start
        finally:
            if self.info.is_main:
                shutil.rmtree(probe, ignore_errors=True)

    def last_good(self) -> Optional[Path]:
        """The newest complete step checkpoint whose weights are finite."""
        return last_good_checkpoint(self.ckpt_root)

    def _write(self, root: Path, keep_last: int) -> Path:
        info, state = self.info, self.state
        (bad,) = D.agree_max([int(not weights_finite(self.raw_model))], info)
        if bad:
            last = self.last_good()
            raise NonFiniteCheckpoint(f"the weights at step {state.step} are not finite; no checkpoint written. "
                                      + (f"The last good checkpoint is {last}" if last else "There is no earlier checkpoint")
                                      + " — lower optim.lr, raise optim.warmup_steps or check the data", last)
        model_state = full_model_state(self.raw_model)  # collectives under FSDP: every rank calls these
        optim_state = full_optimizer_state(self.raw_model, self.optimizers)
        # Every rank's generators (dropout differs per rank), so each resumes exactly where it was.
        ranks = D.gather_objects(rng_states_of_this_process(), info)
        rng_state = {**ranks[0], "ranks": ranks}
        path, error = None, None
        if info.is_main:
            try:
                path = save_checkpoint(root, state.step, model_state, self.run.cfg.model, self.tokenizer_path,
                                       state.to_json(), self.run.config_yaml, optim_state, keep_last, rng_state)
            except ValueError as e:  # a write failure (disk full, permissions, …): one line, nothing lost
                error = e
        (failed,) = D.agree_max([int(error is not None)], info)
        if error is not None:
            raise error
        if failed:
            raise ValueError("rank 0 could not write the checkpoint (its error names the cause); stopping every rank")
        return path


def weights_finite(model: torch.nn.Module) -> bool:
    """Whether every local parameter (a shard under FSDP) is finite; agree_max combines the ranks.
    Note: a CPU-GPU sync point."""
    local = lambda p: p.detach().to_local() if hasattr(p, "to_local") else p.detach()  # noqa: E731  (DTensor)
    flags = [torch.isfinite(local(p)).all() for p in model.parameters()]
    return bool(torch.stack(flags).all()) if flags else True
