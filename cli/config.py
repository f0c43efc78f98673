"""Hydra config → typed config, the one place for every entry point: the schema under
configs/train.yaml, composing it with command-line overrides into a TrainConfig (train.py's
resolve_config, with a resume's checkpoint config merged in, or Hydra's compose API for the programs
behind scripts/), reading overrides by Hydra's grammar, and a data config for evaluate.py --data."""
import dataclasses
import difflib
import os
import sys
import typing
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from cli import REPO
from cli.entry import one_line
from data import DataConfig
from cli.start_from import start_from_weights
from training.checkpoint.init_from import InitFrom
from training.checkpoint.resume import Resume
from training.config import TrainConfig
from training.runtime.run_files import CONFIG

CONFIGS = REPO / "configs"
TOP_LEVEL_KEYS = ("seed", "run_name", "outputs_dir", "verify_checkpoint")
# What a resume may change: how the run goes on — never which model or which tokens it trains on.
RESUMABLE_DATA_KEYS = ("cache_dir", "num_proc")


class ConfigError(ValueError):
    """A config that does not compose, or whose values do not fit together: one line naming the value."""


def check_override_keys(argv: Sequence[str]) -> None:
    """A ConfigError for a `key.path=value` on the command line whose key is no setting, naming the closest one,
    or whose value is not of the setting's type (`optim.lr=abc`): Hydra's own answers are 6–7 lines (its `+key=…`
    hint leads to a second error). Groups, Hydra's flags and keys, `+`/`~` overrides and sweeps are left to Hydra."""
    hints_of = lambda owner: typing.get_type_hints(owner) if dataclasses.is_dataclass(owner) else {}  # noqa: E731
    for arg in argv:
        key = arg.split("=", 1)[0]
        if "=" not in arg or key[0] in "+~-" or key.startswith("hydra."):
            continue
        if "." not in key and dataclasses.is_dataclass(_unwrap_optional(hints_of(TrainConfig).get(key, TrainConfig))):
            continue  # a group (model=25m, experiment=…) or a name Hydra resolves
        owner, path, parts = TrainConfig, [], key.split(".")
        for depth, part in enumerate(parts):
            hints = hints_of(owner)
            if not hints:
                break  # a mapping or a value: nothing to check below it
            if part not in hints:
                where = ".".join(path) or "the top level"
                close = difflib.get_close_matches(part, hints, n=1)
                hint = f"did you mean {'.'.join([*path, close[0], *parts[depth + 1:]])}? " if close else ""
                raise ConfigError(f"{key} is not a setting ({where} has no {part!r}); {hint}README's configuration "
                                  "table lists every setting")
            path.append(part)
            parent, owner = owner, _unwrap_optional(hints[part])
        else:
            _check_value_type(arg, parent, parts[-1], owner)


def _check_value_type(arg: str, parent, field: str, kind) -> None:
    """A ConfigError if `arg`'s value cannot go into `parent.field` (a `kind`), judged as Hydra will (ranges: later)."""
    try:
        override = OverridesParser.create().parse_override(arg)
    except HydraException:
        return  # Hydra says what is wrong with its own grammar
    if override.is_sweep_override():
        return
    try:
        typed = OmegaConf.structured(parent)
    except OmegaConfBaseException:
        return  # a schema OmegaConf cannot type: nothing to judge by
    try:
        OmegaConf.merge(typed, {field: override.value()})
    except OmegaConfBaseException:
        wanted = {int: "an integer", float: "a number", bool: "true or false"}.get(kind, getattr(kind, "__name__", kind))
        raise ConfigError(f"{arg}: {override.key_or_group} takes {wanted}, not "
                          f"{override.get_value_element_as_str()!r}") from None


def _unwrap_optional(kind):
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind


def register_configs() -> None:
    """Typed schema under the YAML: a typo'd key or a wrong type fails at composition."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


@dataclasses.dataclass
class Resolved:
    """What train.py runs: the typed config, its YAML, and the checkpoint it resumes or starts from (if any)."""
    cfg: TrainConfig
    config_yaml: str
    resume: Optional[Resume] = None
    init: Optional[InitFrom] = None


def resolve_config(dict_cfg: DictConfig) -> Resolved:
    """The typed config and the checkpoint a run continues (`resume=`) or starts from (`init_from=`). A resume
    takes the checkpoint's saved config, command-line key overrides (e.g. trainer.max_steps=…) on top; a start
    from weights takes the checkpoint's model and tokenizer (cli/start_from.py)."""
    resume, init = None, None
    overrides = [o.lstrip("+") for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
    if dict_cfg.resume:
        if any(o.startswith("init_from=") for o in overrides):
            raise ConfigError("resume= continues a run and init_from= starts a new one from a checkpoint's weights; "
                              "pass one of them")
        resume = Resume.open(dict_cfg.resume, dict_cfg.outputs_dir, dict_cfg.get("verify_checkpoint", True),
                             warn=lambda message: print(message, file=sys.stderr))
        groups = [o for o in overrides if "." not in o.split("=")[0] and o.split("=")[0] not in TOP_LEVEL_KEYS]
        if groups:  # the checkpoint's config already holds the composed groups
            print(f"resume: config groups come from the checkpoint; ignoring {' '.join(groups)}", file=sys.stderr)
        overrides = [o for o in overrides if o not in groups]
        saved = _saved_training_config(resume.path)
        _refuse_changes_a_resume_cannot_make(resume.path, saved, overrides)
        saved.trainer.stop_at_step = None  # an early stop applies to the run that stopped, not the resume
        dict_cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved, OmegaConf.from_dotlist(overrides))
    elif dict_cfg.get("init_from"):
        init = start_from_weights(dict_cfg, overrides)
    try:
        said = apply_length_rule(dict_cfg, dict(override_values([o for o in overrides if o.startswith("trainer.")])))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if said and os.environ.get("RANK", "0") == "0":
        print(said)
    cfg, config_yaml = _typed(dict_cfg)
    if cfg.trainer.seq_len > cfg.model.max_seq_len:
        raise ConfigError(f"trainer.seq_len={cfg.trainer.seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len}; "
                          "lower the first or raise the second")
    if resume is not None:
        resume.check_fits(cfg.model)  # model.* overrides may not change the architecture
    if init is not None:
        init.check_fits(cfg.model)
    return Resolved(cfg, config_yaml, resume, init)


def _saved_training_config(ckpt: Path) -> DictConfig:
    """The training config a checkpoint was saved with, or a ConfigError saying why it cannot be resumed."""
    try:
        saved = OmegaConf.load(ckpt / CONFIG)
    except (OSError, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(f"{ckpt}/config.yaml is unreadable ({one_line(e)}); the checkpoint cannot be resumed "
                          "(generate.py, evaluate.py and export_hf.py do not need it)") from None
    missing = [k for k in ("model", "data", "optim", "trainer") if not (OmegaConf.is_dict(saved) and k in saved)]
    if missing:
        raise ConfigError(f"{ckpt}/config.yaml holds no training config (no {', '.join(missing)}: empty, or an imported "
                          "checkpoint), so it cannot be resumed; generate.py, evaluate.py and export_hf.py do not "
                          "need it")
    if OmegaConf.select(saved, "data.sampling") is None:  # saved before data.sampling existed: those runs drew at
        saved.data.sampling = "random"  # random, whatever the default is now, and a resume continues their order
    return saved


def _refuse_changes_a_resume_cannot_make(ckpt: Path, saved: DictConfig, overrides: List[str]) -> None:
    """A resume continues a run: it may change how training goes on (trainer.*, optim.* values, logger.*,
    data.cache_dir), never the model, the tokens or the optimizer kind. Say so before anything runs,
    instead of advice a resume would then refuse."""
    saved_optimizer = OmegaConf.select(saved, "optim.name")
    saved_sampling = saved.data.sampling  # _saved_training_config fills it in for configs older than the setting
    for key, value in override_values(overrides):
        section, _, field = key.partition(".")
        if key == "data.sampling":  # the same tokens, but another order than the one the run is part-way through
            if value != saved_sampling:
                raise ConfigError(f"cannot resume {ckpt} with data.sampling={value}: its run draws batches with "
                                  f"data.sampling={saved_sampling} and a resume continues that order; drop the "
                                  f"override, or start a new run from its weights: init_from={ckpt}")
        elif section == "data" and field not in RESUMABLE_DATA_KEYS:
            raise ConfigError(f"cannot resume {ckpt} with {key}={value}: a resume trains on the checkpoint's data "
                              "and tokenizer; it may change trainer.*, optim.* values, logger.* and data.cache_dir — "
                              f"for other data, start a new run from its weights: init_from={ckpt}")
        if key == "optim.name" and value != saved_optimizer:
            raise ConfigError(f"cannot resume {ckpt} with optim.name={value}: its optimizer state is "
                              f"{saved_optimizer}'s; resume with optim.name={saved_optimizer}, or start a new run")


def _typed(dict_cfg: DictConfig) -> Tuple[TrainConfig, str]:
    """(TrainConfig, its YAML) of a composed config, resolved; `resume` is cleared (merged already)."""
    try:
        plain = OmegaConf.to_container(dict_cfg, resolve=True)
        plain.pop("hydra", None)
        plain["resume"] = None
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), plain))
    except OmegaConfBaseException as e:
        raise ConfigError(str(e).splitlines()[0])
    return cfg, OmegaConf.to_yaml(plain)


def compose(overrides: Sequence[str], keep_hydra: bool = False) -> DictConfig:
    """configs/train.yaml with command-line overrides, through Hydra's compose API, as @hydra.main
    hands it to train.py: HydraConfig set (so ${hydra:runtime.choices.*} resolves) and the hydra node
    removed, unless keep_hydra (e.g. to read hydra.sweeper.params). A config that does not compose is
    a ConfigError."""
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
    """(TrainConfig, its YAML) for `python train.py <overrides>`: composed and typed as train.py does,
    checked by the schema and the dataclasses, the length rule applied (resolve_config's own checks:
    compose_run_config)."""
    cfg = compose(overrides)
    try:
        apply_length_rule(cfg, dict(override_values([o for o in overrides if o.startswith("trainer.")])))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return _typed(cfg)


def compose_run_config(overrides: Sequence[str]) -> TrainConfig:
    """The TrainConfig train.py would run with these overrides, with every check resolve_config makes."""
    return resolve_config(compose(overrides)).cfg


def override_values(overrides: Sequence[str]) -> List[Tuple[str, object]]:
    """(dotted key, value) of each key=value override, parsed by Hydra's own grammar
    (model.qk_norm=true → True, 1e-3 → 0.001), so it means what it would on the command line. One
    that does not parse, or that sweeps several values, is a ConfigError."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(one_line(e)) from None
    for o in parsed:
        if o.is_sweep_override():
            raise ConfigError(f"{o.input_line!r} sweeps several values; a variant or size sets one")
    return [(o.key_or_group, o.value()) for o in parsed]


def load_data_config(data: Optional[str], ckpt: Path, sets: Sequence[str]) -> DataConfig:
    """evaluate.py's data: `--data NAME` (configs/data/NAME.yaml) or `--data FILE.yaml`, else the
    checkpoint's config.yaml data section; `--set KEY=VALUE` on top."""
    if data is None:
        saved = OmegaConf.load(ckpt / CONFIG) if (ckpt / CONFIG).is_file() else OmegaConf.create()
        if not OmegaConf.is_dict(saved) or "data" not in saved:
            raise ValueError(f"{ckpt} has no training config with a data section; pass --data or --text")
        node = saved.data
    else:
        is_file = data.endswith((".yaml", ".yml"))
        path = Path(data) if is_file else CONFIGS / "data" / f"{data}.yaml"
        if not path.is_file():
            names = sorted(p.stem for p in (CONFIGS / "data").glob("*.yaml"))
            raise ValueError(f"--data {data}: no such config or cache directory; use one of {', '.join(names)}, "
                             "a YAML file or a prepared cache directory")
        node = OmegaConf.load(path)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(DataConfig), node, OmegaConf.from_dotlist(list(sets)))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ValueError(f"data config: {str(e).splitlines()[0]}") from None


LENGTH_KEYS = ("max_steps", "max_epochs", "time_budget")
# What a typed length turns off among the config's: steps and epochs are exact; a budget keeps the config's epochs.
TURNS_OFF = {"max_steps": ("max_epochs", "time_budget"), "max_epochs": ("max_steps", "time_budget"),
             "time_budget": ("max_steps",)}


def apply_length_rule(cfg: DictConfig, given: Dict[str, object]) -> Optional[str]:
    """The rule for the run's length settings (docs/training.md): the run ends at the first reached of those set;
    what the command line sets turns off the config files' ones that TURNS_OFF names, said in one line (returned);
    a typed max_steps with another typed length is a ValueError. `given`: the command line's trainer.* values."""
    typed = {key: given[f"trainer.{key}"] for key in LENGTH_KEYS if f"trainer.{key}" in given}
    chosen = {key: value for key, value in typed.items() if value is not None}
    if "max_steps" in chosen and len(chosen) > 1:
        a, b = (f"trainer.{key}={value:g}" for key, value in list(chosen.items())[:2])
        raise ValueError(f"{a} and {b} both set the run's length, and a step count is exact; keep one (or type "
                         "trainer.max_epochs and trainer.time_budget together: the run ends at whichever comes first)")
    off = {other for key in chosen for other in TURNS_OFF[key]} - set(typed)
    dropped = [f"trainer.{key}={cfg.trainer[key]:g}" for key in LENGTH_KEYS
               if key in off and cfg.trainer.get(key) is not None]
    if not dropped:
        return None
    with open_dict(cfg):
        for key in off:
            cfg.trainer[key] = None
    said = " and ".join(f"trainer.{key}={value:g}" for key, value in chosen.items())
    return (f"length: {said} from the command line decides it; {' and '.join(dropped)} from the config "
            f"{'are' if len(dropped) > 1 else 'is'} off")
