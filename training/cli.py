"""The command line of train.py: configs + overrides → a checked TrainConfig through Hydra (a resume's or init_from's
checkpoint merged in), the checks before a run starts, SIGTERM as Ctrl-C. The other programs': training/program.py."""

import dataclasses
import difflib
import os
import shutil
import signal
import sys
import tempfile
import typing
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from data.tokenizer import load_tokenizer
from model.config import ModelConfig
from training import Interrupted, one_line
from training.config import TrainConfig

if typing.TYPE_CHECKING:  # the checkpoint (torch) is imported where one is opened: preparing data never loads it
    from training.checkpoint import InitFrom, Resume

# ---- SIGTERM ----


def sigterm_interrupts() -> None:
    """From here on SIGTERM interrupts like Ctrl-C (the default would kill at once: no line, scratch left)."""

    def handle(signum, frame):
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, handle)


# ---- Hydra → the typed config ----

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TOP_LEVEL_KEYS = ("seed", "run_name", "outputs_dir", "verify_checkpoint", "resume_changed_data")
LENGTH_KEYS = ("max_steps", "max_epochs", "time_budget")
# What a typed length turns off among the config's: steps and epochs are exact; a budget keeps the config's epochs.
TURNS_OFF = {
    "max_steps": ("max_epochs", "time_budget"),
    "max_epochs": ("max_steps", "time_budget"),
    "time_budget": ("max_steps",),
}


class ConfigError(ValueError):
    """A config that does not compose, or whose values do not fit together: one line naming the value."""


def _hints(owner) -> dict:
    return typing.get_type_hints(owner) if dataclasses.is_dataclass(owner) else {}


def _unwrap(kind):
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind


def check_override_keys(argv: Sequence[str]) -> None:
    """A `key.path=value` whose key is no setting (naming the closest), whose value is not of its type, or a group's
    option no config file holds, in one line (Hydra's answers are 6-12); Hydra's own keys and +/~ overrides are left
    to Hydra."""
    for arg in argv:
        key = arg.split("=", 1)[0]
        if "=" not in arg or key[0] in "+~-" or key.startswith("hydra."):
            continue
        if "." not in key and dataclasses.is_dataclass(_unwrap(_hints(TrainConfig).get(key, TrainConfig))):
            check_group_option(arg, argv)  # a group (model=25m, experiment=…) or a name Hydra resolves
            continue
        owner, path, parts = TrainConfig, [], key.split(".")
        for depth, part in enumerate(parts):
            hints = _hints(owner)
            if not hints:
                break  # a mapping or a value: nothing to check below it
            if part not in hints:
                close = difflib.get_close_matches(part, hints, n=1)
                hint = f"did you mean {'.'.join([*path, close[0], *parts[depth + 1 :]])}? " if close else ""
                raise ConfigError(
                    f"{key} is not a setting ({'.'.join(path) or 'the top level'} has no {part!r}); "
                    f"{hint}README's configuration table lists every setting"
                )
            path.append(part)
            parent, owner = owner, _unwrap(hints[part])
        else:
            try:
                override = OverridesParser.create().parse_override(arg)
                if override.is_sweep_override():
                    continue
                typed = OmegaConf.structured(parent)
            except (HydraException, OmegaConfBaseException):
                continue  # Hydra says what is wrong with its own grammar
            try:
                OmegaConf.merge(typed, {parts[-1]: override.value()})
            except OmegaConfBaseException:
                wanted = {int: "an integer", float: "a number", bool: "true or false"}.get(
                    owner, getattr(owner, "__name__", owner)
                )
                raise ConfigError(
                    f"{arg}: {override.key_or_group} takes {wanted}, not {override.get_value_element_as_str()!r}"
                ) from None


def check_group_option(arg: str, argv: Sequence[str]) -> None:
    """`model=25M`: an option of a config group that no file on Hydra's search path holds (configs/, the folders of a
    hydra.searchpath in train.yaml or the overrides), with the options there. Other config folders: left to Hydra."""
    try:
        override = OverridesParser.create().parse_override(arg)
    except HydraException:
        return  # Hydra says what is wrong with its own grammar
    group, value = override.key_or_group, override.value()
    options = {p.stem for p in (CONFIGS / group).glob("*.yaml")}
    missing = [o for o in getattr(value, "list", [value]) if isinstance(o, str) and o not in options]  # [a,b] sweeps
    if not (options and missing) or any(a.startswith(("-cd", "-cp", "-cn", "--config")) for a in argv):
        return
    paths = list(OmegaConf.select(OmegaConf.load(CONFIGS / "train.yaml"), "hydra.searchpath", default=None) or [])
    for other in (a for a in argv if a.startswith("hydra.searchpath=")):
        paths += OverridesParser.create().parse_override(other).value()
    if not all(str(p).startswith("file://") for p in paths):
        return  # a package's configs: Hydra lists them
    options |= {p.stem for path in paths for p in (Path(str(path).removeprefix("file://")) / group).glob("*.yaml")}
    if missing := [o for o in missing if o not in options]:
        close = difflib.get_close_matches(missing[0], options, n=1)
        raise ConfigError(
            f"{group}={missing[0]} is no option of the config group {group}; "
            + (f"did you mean {group}={close[0]}? " if close else "")
            + f"its options are {', '.join(sorted(options))}"
        )


def register_configs() -> None:
    """The typed schema under the YAML: a typo'd key or a wrong type fails at composition."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


@dataclasses.dataclass
class Resolved:
    """What train.py runs: the typed config, its YAML, and the checkpoint it resumes or starts from (if any)."""

    cfg: TrainConfig
    config_yaml: str
    resume: Optional["Resume"] = None
    init: Optional["InitFrom"] = None


def resolve_config(dict_cfg: DictConfig) -> Resolved:
    """The typed config and the checkpoint a run continues (`resume=`: its saved config, command-line keys on top) or
    starts from (`init_from=`: its model and tokenizer)."""
    resume, init = None, None
    overrides = [o.lstrip("+") for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
    warn = lambda message: print(message, file=sys.stderr)  # noqa: E731
    if dict_cfg.resume:
        if any(o.startswith("init_from=") for o in overrides):
            raise ConfigError(
                "resume= continues a run and init_from= starts a new one from a checkpoint's weights; pass one of them"
            )
        from training.checkpoint import Resume

        resume = Resume.open(dict_cfg.resume, dict_cfg.outputs_dir, dict_cfg.get("verify_checkpoint", True))
        groups = [o for o in overrides if "." not in o.split("=")[0] and o.split("=")[0] not in TOP_LEVEL_KEYS]
        if groups:  # the checkpoint's config already holds the composed groups
            warn(f"resume: config groups come from the checkpoint; ignoring {' '.join(groups)}")
        overrides = [o for o in overrides if o not in groups]
        saved = saved_training_config(resume.path)
        _refuse_changes_a_resume_cannot_make(resume.path, saved, overrides)
        saved.trainer.stop_at_step = None  # an early stop applies to the run that stopped, not the resume
        dict_cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved, OmegaConf.from_dotlist(overrides))
        _model_of(dict_cfg, resume, overrides)
    elif dict_cfg.get("init_from"):
        init = _start_from_weights(dict_cfg, overrides)
    said = apply_length_rule(dict_cfg, overrides)
    if said and os.environ.get("RANK", "0") == "0":
        print(said)
    cfg, config_yaml = typed_config(dict_cfg)
    if cfg.trainer.seq_len > cfg.model.max_seq_len:
        raise ConfigError(
            f"trainer.seq_len={cfg.trainer.seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len}; "
            "lower the first or raise the second"
        )
    for opened in (resume, init):  # model.* overrides may not change the architecture
        if opened is not None:
            opened.check_fits(cfg.model)
    return Resolved(cfg, config_yaml, resume, init)


def _start_from_weights(dict_cfg: DictConfig, overrides: List[str]) -> "InitFrom":
    """init_from=: a minillama checkpoint, or a Hugging Face Llama directory imported once into the data cache; the run
    takes its model and tokenizer, everything else is the new run's."""
    from interop.hf import cached_import, is_hf_directory
    from training.checkpoint import InitFrom

    source, verify = str(dict_cfg.init_from), dict_cfg.get("verify_checkpoint", True)
    path = str(cached_import(source, dict_cfg.data.cache_dir, verify=verify)) if is_hf_directory(source) else source
    init = InitFrom.open(path, dict_cfg.outputs_dir, verify, source=source)
    if groups := [o for o in overrides if o.split("=")[0] in ("model", "experiment")]:
        print(f"init_from: the model comes from {init.path}; {' '.join(groups)} set the rest of the run only")
    _model_of(dict_cfg, init, overrides)
    with open_dict(dict_cfg):
        if any(o.startswith("data.tokenizer_path=") for o in overrides):
            init.check_tokenizer(dict_cfg.data.tokenizer_path)
        else:
            dict_cfg.data.tokenizer_path = str(init.carry_tokenizer(dict_cfg.data.cache_dir))
        vocab = load_tokenizer(dict_cfg.data.tokenizer_path).get_vocab_size()
        typed = dict(override_values([o for o in overrides if o.startswith("data.vocab_size=")]))
        if typed and typed["data.vocab_size"] != vocab:
            raise ConfigError(
                f"init_from={source} keeps its {vocab}-token tokenizer (the weights read its ids), so "
                f"data.vocab_size={typed['data.vocab_size']} cannot apply; drop it, or train from scratch for another "
                "vocabulary"
            )
        dict_cfg.data.vocab_size = vocab  # what config.yaml records is what the run trains with
    return init


def _model_of(dict_cfg: DictConfig, opened, overrides: List[str]) -> None:
    """The run's model is the checkpoint's, the command line's model.* keys on top (check_fits refuses misfits)."""
    with open_dict(dict_cfg):
        dict_cfg.model = OmegaConf.merge(
            OmegaConf.structured(ModelConfig),
            dataclasses.asdict(opened.model),
            OmegaConf.from_dotlist([o[6:] for o in overrides if o.startswith("model.")]),
        )


def saved_training_config(ckpt: Path) -> DictConfig:
    """The training config a checkpoint was saved with, or a ConfigError saying why it cannot resume."""
    from training.checkpoint import CONFIG

    try:
        saved = OmegaConf.load(ckpt / CONFIG)
    except (OSError, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(
            f"{ckpt}/config.yaml is unreadable ({one_line(e)}); the checkpoint cannot be resumed "
            "(generate.py, evaluate.py and export_hf.py do not need it)"
        ) from None
    missing = [k for k in ("model", "data", "optim", "trainer") if not (OmegaConf.is_dict(saved) and k in saved)]
    if missing:
        raise ConfigError(
            f"{ckpt}/config.yaml holds no training config (no {', '.join(missing)}: empty, or an imported "
            "checkpoint), so it cannot be resumed; generate.py, evaluate.py and export_hf.py do not need it"
        )
    return saved


def _refuse_changes_a_resume_cannot_make(ckpt: Path, saved: DictConfig, overrides: List[str]) -> None:
    """A resume may change how training goes on (trainer.*, optim.* values, logger.*, where its data lies), never the
    model, the tokens, their order or the optimizer kind: said before anything runs."""
    for key, value in override_values(overrides):
        if key.startswith("data.") and key not in ("data.path", "data.cache_dir", "data.sampling"):
            raise ConfigError(
                f"cannot resume {ckpt} with {key}={value}: a resume trains on the checkpoint's data and tokenizer; it "
                "may change trainer.*, optim.* values, logger.*, data.path (the same corpus, moved) and "
                f"data.cache_dir — for other data, start a new run from its weights: init_from={ckpt}"
            )
        if key == "data.sampling" and value != saved.data.sampling:
            raise ConfigError(
                f"cannot resume {ckpt} with data.sampling={value}: its run draws batches with "
                f"data.sampling={saved.data.sampling} and a resume continues that order; drop the override, "
                f"or start a new run from its weights: init_from={ckpt}"
            )
        if key == "optim.name" and value != OmegaConf.select(saved, "optim.name"):
            raise ConfigError(
                f"cannot resume {ckpt} with optim.name={value}: its optimizer state is "
                f"{OmegaConf.select(saved, 'optim.name')}'s; resume with optim.name="
                f"{OmegaConf.select(saved, 'optim.name')}, or start a new run"
            )


def flat(tree, prefix: str = "") -> dict:
    """{"trainer.max_steps": 100, …}: a nested config's values by dotted key."""
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    return {k: v for key, value in tree.items() for k, v in flat(value, f"{prefix}{key}.").items()}


def differing_keys(a: dict, b: dict) -> List[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def check_same_config(config_yaml: str, info) -> None:
    """Before the first step, every rank's resolved config is rank 0's, or one line naming the first keys that differ
    (an override read from a rank's environment, a config file that differs between hosts)."""
    from training.distributed import gather_objects

    texts = gather_objects(config_yaml, info)
    if (odd := next((r for r, text in enumerate(texts) if text != texts[0]), None)) is None:
        return
    a, b = (flat(OmegaConf.to_container(OmegaConf.create(texts[r]))) for r in (0, odd))
    said = ", ".join(f"{k} ({b.get(k)!r} there, {a.get(k)!r} on rank 0)" for k in differing_keys(a, b)[:3])
    raise ConfigError(
        f"rank {odd} composed another config than rank 0: {said}; every rank must train the same config — pass "
        "the same overrides to each, none read from a rank's environment"
    )


def keep_edited_config(run_dir: Path, ckpt: Path) -> Optional[str]:
    """Before a resume rewrites <run>/config.yaml: an edited one is moved aside, the warning naming the keys returned."""
    from training.checkpoint import CONFIG

    mine, theirs = Path(run_dir) / CONFIG, Path(ckpt) / CONFIG
    try:
        here, there = (OmegaConf.to_container(OmegaConf.load(p)) for p in (mine, theirs))
    except (OSError, OmegaConfBaseException, ValueError):
        return None  # no file of the user's, or one that is not YAML: nothing to compare
    a, b = flat(here), flat(there)
    keys = [k for k in differing_keys(a, b) if k != "trainer.stop_at_step"]  # a resume clears that one itself
    if not keys:
        return None
    n = 1 + sum(1 for _ in Path(run_dir).glob("config.edited-*.yaml"))
    kept = mine.rename(Path(run_dir) / f"config.edited-{n}.yaml")
    said = ", ".join(f"{k} ({a.get(k)!r} there, {b.get(k)!r} in the checkpoint)" for k in keys[:4])
    more = f" and {len(keys) - 4} more" if len(keys) > 4 else ""
    return (
        f"warning: {mine} differs from {ckpt}/config.yaml in {said}{more}: a resume reads the checkpoint's config, "
        f"so changes go on the command line (python train.py resume={ckpt} {keys[0]}=…); the file is kept as {kept}"
    )


def apply_length_rule(cfg: DictConfig, overrides: Sequence[str]) -> Optional[str]:
    """The rule for the run's length settings (docs/training.md): a length the command line sets turns off the
    config's ones TURNS_OFF names, said in one line (returned); typed max_steps with another is a ConfigError."""
    given = dict(override_values([o for o in overrides if o.startswith("trainer.")]))
    typed = {key: given[f"trainer.{key}"] for key in LENGTH_KEYS if f"trainer.{key}" in given}
    chosen = {key: value for key, value in typed.items() if value is not None}
    if "max_steps" in chosen and len(chosen) > 1:
        a, b = (f"trainer.{key}={value:g}" for key, value in list(chosen.items())[:2])
        raise ConfigError(
            f"{a} and {b} both set the run's length, and a step count is exact; keep one (or type "
            "trainer.max_epochs and trainer.time_budget together: the run ends at whichever comes first)"
        )
    off = {other for key in chosen for other in TURNS_OFF[key]} - set(typed)
    dropped = [
        f"trainer.{key}={cfg.trainer[key]:g}" for key in LENGTH_KEYS if key in off and cfg.trainer.get(key) is not None
    ]
    if not dropped:
        return None
    with open_dict(cfg):
        for key in off:
            cfg.trainer[key] = None
    said = " and ".join(f"trainer.{key}={value:g}" for key, value in chosen.items())
    return (
        f"length: {said} from the command line decides it; {' and '.join(dropped)} from the config "
        f"{'are' if len(dropped) > 1 else 'is'} off"
    )


def typed_config(dict_cfg: DictConfig) -> Tuple[TrainConfig, str]:
    """(TrainConfig, its YAML) of a composed config, resolved; `resume` cleared (merged already)."""
    try:
        plain = OmegaConf.to_container(dict_cfg, resolve=True)
        plain.pop("hydra", None)
        plain["resume"] = None
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), plain))
    except OmegaConfBaseException as e:
        raise ConfigError(str(e).splitlines()[0])
    return cfg, OmegaConf.to_yaml(plain)


def override_values(overrides: Sequence[str]) -> List[Tuple[str, object]]:
    """(dotted key, value) of each override by Hydra's grammar; one that does not parse or sweeps is a ConfigError."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(one_line(e)) from None
    for o in parsed:
        if o.is_sweep_override():
            raise ConfigError(f"{o.input_line!r} sweeps several values; a variant or size sets one")
    return [(o.key_or_group, o.value()) for o in parsed]


# ---- Hydra's callback: the run directory can be written ----


class OutputDirCheck(Callback):
    def on_run_start(self, config, **kwargs) -> None:
        check_writable(_resolved(config, "hydra.run.dir"), "the run directory", "hydra.run.dir", config.outputs_dir)

    def on_multirun_start(self, config, **kwargs) -> None:
        check_writable(_resolved(config, "hydra.sweep.dir"), "the sweep directory", "hydra.sweep.dir", None)


def _resolved(config, key: str) -> str:
    """The directory as Hydra will resolve it: HydraConfig set first (Hydra sets it to this config just after the
    run-start callbacks), so the default run_name's ${hydra:runtime.choices…} resolves."""
    HydraConfig.instance().set_config(config)
    return OmegaConf.select(config, key)


def check_writable(directory: str, what: str, key: str, outputs_dir: Optional[str]) -> None:
    """Exit with one line unless a directory can be made where `directory` will be: tried for real in its nearest
    existing ancestor (permission bits do not tell what root, ACLs or a read-only mount allow)."""
    target = Path(directory).absolute()
    ancestor = next(p for p in (target, *target.parents) if p.exists())
    inside = outputs_dir is not None and target.is_relative_to(Path(outputs_dir).absolute())
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".minillama-write-check-", dir=ancestor))
    except OSError as e:
        cause = "it is a file" if ancestor.is_file() else e.strerror.lower() if e.strerror else one_line(e)
        print(
            f"error: cannot create {what} {target}: {cause} ({ancestor}); set {'outputs_dir' if inside else key}=… "
            "to a writable directory",
            file=sys.stderr,
        )
        sys.exit(1)
