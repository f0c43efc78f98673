"""Checkpoints: one directory per saved step (format.py lists its files), written atomically (save.py),
read back with every file verified against its hash and checked (manifest.py, load.py, consistency.py), tidied at start (cleanup.py), and taken by
the training loop through the Checkpointer (checkpointer.py), which decides when to save."""
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.cleanup import clean_partial_checkpoints, move_aside_later_checkpoints
from training.checkpoint.consistency import check_checkpoint_consistency, check_resume_fits, check_resume_tokenizer
from training.checkpoint.errors import CheckpointError, CheckpointWriteError, NonFiniteCheckpoint
from training.checkpoint.format import (BEST, TIED_KEY, TOKENIZER, checkpoint_name, checkpoint_step,
                                        last_good_checkpoint, list_checkpoints, load_model_config, resolve_checkpoint,
                                        run_checkpoints, run_dir_of)
from training.checkpoint.manifest import verify
from training.checkpoint.load import load_model, load_training_state, load_weights, read_weights, restore_rng
from training.checkpoint.save import save_checkpoint, save_weights

__all__ = ["BEST", "Checkpointer", "CheckpointError", "CheckpointWriteError", "NonFiniteCheckpoint", "TIED_KEY",
           "TOKENIZER", "check_checkpoint_consistency", "check_resume_fits", "check_resume_tokenizer", "checkpoint_name",
           "checkpoint_step", "clean_partial_checkpoints", "last_good_checkpoint", "list_checkpoints", "load_model", "load_model_config",
           "load_training_state", "load_weights", "move_aside_later_checkpoints", "read_weights", "resolve_checkpoint",
           "restore_rng", "run_checkpoints", "run_dir_of", "save_checkpoint", "save_weights", "verify"]
