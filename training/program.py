"""What the programs of scripts/, lab/ and dev/ share (train.py needs none of it): the config train.py would compose,
the --help text, --no-verify, UTF-8 files, and how a program ends: one `error:` line and 1, or 130/143 on a signal."""

import argparse
import signal
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, open_dict
from omegaconf.errors import OmegaConfBaseException

from training import one_line
from training.cli import (
    ConfigError,
    apply_length_rule,
    check_override_keys,
    register_configs,
    resolve_config,
    sigterm_interrupts,
    typed_config,
)
from training.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]  # configs/, train.py and BENCHMARKS.md live here
CONFIGS = REPO / "configs"
USER_ERRORS = (ValueError, OSError)  # DataError, CheckpointError, ConfigError, … are ValueErrors

# ---- how a program ends ----


def exit_status(
    main: Callable, argv: Optional[Sequence[str]] = None, also: tuple = (), interrupted: Optional[str] = None
) -> int:
    """main(argv)'s status: a user's error is one `error: …` line and 1; Ctrl-C 130, SIGTERM 143, with one line."""
    try:
        return main(argv) or 0
    except (*USER_ERRORS, *also) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(interrupted or f"\n{signal.Signals(signum).name}: interrupted", file=sys.stderr)
        return 128 + int(signum)


def run(main: Callable, also: tuple = (), interrupted: Optional[str] = None) -> None:
    """A script's whole body: exit with main's status on the command line's arguments."""
    sigterm_interrupts()
    sys.exit(exit_status(main, None, also, interrupted))


def read_utf8(path, flag: str) -> str:
    """A text file's content; one line naming the file when it is not UTF-8 (or cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{flag} {path} is not UTF-8 text ({e.reason} at byte {e.start}); convert it to UTF-8"
        ) from None
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror.lower() if e.strerror else e}") from None


def description(doc: str) -> str:
    """A program's --help text: its docstring's first paragraph, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def add_no_verify(parser: argparse.ArgumentParser) -> None:
    """--no-verify: a program that loads a checkpoint (or an exported directory) checks its files first, unless told."""
    parser.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip checking the files against their manifest.json (SHA-256; ~1 s per GB)",
    )


# ---- the config train.py would run ----


def compose(overrides: Sequence[str], keep_hydra: bool = False) -> DictConfig:
    """configs/train.yaml with overrides, as @hydra.main hands it to train.py (HydraConfig set; the hydra node removed
    unless keep_hydra); a ConfigError if it does not compose (a mistyped key or option: train.py's line)."""
    check_override_keys(overrides)
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = hydra_compose("train", overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(one_line(e)) from None
    HydraConfig.instance().set_config(cfg)
    if not keep_hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def compose_train_config(overrides: Sequence[str]) -> Tuple[TrainConfig, str]:
    """(TrainConfig, its YAML) for `python train.py <overrides>`: composed, the length rule applied, typed."""
    cfg = compose(overrides)
    apply_length_rule(cfg, overrides)
    return typed_config(cfg)


def compose_run_config(overrides: Sequence[str]) -> TrainConfig:
    """The TrainConfig train.py would run with these overrides, with every check resolve_config makes."""
    return resolve_config(compose(overrides)).cfg
