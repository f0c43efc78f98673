"""Every config group option and every experiment composes onto the typed schema and builds a model."""

import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from model import Transformer
from tests import forked
from training.cli import ConfigError, check_override_keys
from training.config import TrainConfig
from training.program import compose_train_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TRAIN_PY = CONFIGS.parent / "train.py"  # run as a real process, forked from a server that has imported torch
GROUPS = ["model", "data", "optim", "trainer", "logger", "debug", "experiment"]


def options(group: str) -> list:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def compose_typed(overrides: list) -> TrainConfig:
    """The typed config train.py would run with these overrides."""
    return compose_train_config(overrides)[0]


def test_every_group_has_options():
    for group in GROUPS:
        assert options(group), f"configs/{group}/ is empty"


def own_values(group: str, option: str) -> dict:
    """The dotted keys an option's YAML sets itself (not through its defaults or an interpolation)."""
    path = CONFIGS / group / f"{option}.yaml"
    root = "" if "@package _global_" in path.read_text() else f"{group}."
    flat = {}

    def walk(node, prefix):
        for key, value in node.items():
            if key in ("defaults", "hydra"):
                continue
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif not (isinstance(value, str) and "${" in value):
                flat[f"{prefix}{key}"] = value

    walk(OmegaConf.to_container(OmegaConf.load(path), resolve=False), root)  # YAML as Hydra reads it (3e-3 a float)
    return flat


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in options(g)])
def test_each_option_composes_builds_and_its_values_arrive(group, option):
    """Every value the option's file sets is what the typed config holds (nothing silently dropped by
    a schema default or another group), and the model it describes builds."""
    overrides = [f"{group}={option}"]
    if group == "data" and option == "local":
        overrides.append("data.path=some/file.txt")
    cfg = compose_typed(overrides)
    assert isinstance(cfg, TrainConfig)
    plain = OmegaConf.structured(cfg)
    values = own_values(group, option)
    assert values, f"configs/{group}/{option}.yaml sets nothing"
    for key, value in values.items():
        if key == "data.path" and option == "local":
            value = "some/file.txt"  # the required value, given above
        got = OmegaConf.select(plain, key)
        if "${" in str(value):  # an interpolation (e.g. a tag "norm=${model.norm}"): resolved against the config
            untyped = OmegaConf.create({**OmegaConf.to_container(plain), "expected_": value})
            value = OmegaConf.to_container(untyped, resolve=True)["expected_"]
            got = OmegaConf.to_container(OmegaConf.create({"v": got}))["v"]
        assert got == value or (isinstance(got, str) and got == str(value).lower()), key  # str fields: false → "false"
    with torch.device("meta"):  # shapes only: even the 125M config builds instantly
        model = Transformer(cfg.model)
    counts = model.param_counts()
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert cfg.trainer.seq_len <= cfg.model.max_seq_len and cfg.model.vocab_size == cfg.data.vocab_size


@pytest.mark.parametrize("option", options("model"))
def test_model_presets_have_the_sizes_their_files_state(option):
    """The "~N M non-embedding" each configs/model/*.yaml states in its first line is what it builds (±6 %)."""
    first_line = (CONFIGS / "model" / f"{option}.yaml").read_text().splitlines()[0]
    stated = re.search(r"~([\d.]+)M non-embedding", first_line)
    assert stated, f"configs/model/{option}.yaml: the first line should state '~N M non-embedding'"
    cfg = compose_typed([f"model={option}"])
    with torch.device("meta"):
        counts = Transformer(cfg.model).param_counts()
    built = counts["total"] - counts["embedding"] - counts["lm_head"]
    assert built == pytest.approx(float(stated.group(1)) * 1e6, rel=0.06), f"{option}: {built:,} parameters"


SHAPE = ("hidden_size", "n_layers", "n_heads", "n_kv_heads")


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_study_preset_pins_its_model_shape(experiment):
    """A preset's study means the same model whatever the default is: composed on top of two different
    model groups, it trains the same shape."""
    shapes = [
        tuple(getattr(compose_train_config([f"experiment={experiment}", f"model={base}"])[0].model, k) for k in SHAPE)
        for base in ("cpu", "25m")
    ]
    assert shapes[0] == shapes[1], f"experiment={experiment} takes its model shape from the model group: {shapes}"


def test_the_readmes_default_run_is_what_train_py_composes():
    """README.md shows a real default run: its header's model line (depth, width, parameters) and its
    time budget are what `python train.py` composes today — a default change without a new README block
    fails here."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("## What the default run does", 1)[1].split("\n## ", 1)[0]
    model_line = next(line for line in block.splitlines() if line.startswith("model: "))
    cfg, _ = compose_train_config([])
    with torch.device("meta"):
        counts = Transformer(cfg.model).param_counts()
    m = cfg.model
    assert model_line.startswith(
        f"model: {m.norm} + {m.mlp}, hidden_size {m.hidden_size}, intermediate_size "
        f"{m.resolved_intermediate_size}, {m.depth}, parametrization {m.parametrization}, "
        f"{counts['total'] / 1e6:.2f}M parameters"
    ), model_line
    assert m.n_layers >= 4  # a LLaMA stack: a residual stream across blocks, depth for induction heads
    budget, passes = cfg.trainer.time_budget, f"{cfg.trainer.max_epochs:g}"
    length = f"{budget:g} min or {passes} passes over every window (trainer.max_epochs={passes}), whichever comes first"
    assert f"(trainer.time_budget={length}: the budget's first plan after step" in block
    assert f"time budget {length} → " in block


@pytest.mark.parametrize(
    "arg, said",
    [
        (
            "model.hidden_sise=128",
            "model.hidden_sise is not a setting (model has no 'hidden_sise'); did you mean model.hidden_size?",
        ),
        (
            "modle.n_layers=3",
            "modle.n_layers is not a setting (the top level has no 'modle'); did you mean model.n_layers?",
        ),
        ("trainer.zzz=1", "trainer.zzz is not a setting (trainer has no 'zzz'); README's configuration table"),
    ],
)
def test_a_mistyped_key_is_one_line_naming_the_closest_setting(arg, said):
    with pytest.raises(ConfigError) as raised:
        check_override_keys(["model=cpu", arg])
    assert str(raised.value).startswith(said) and "\n" not in str(raised.value)


def test_every_real_key_group_and_hydra_flag_passes_the_key_check():
    check_override_keys(
        [
            "model=25m",
            "trainer.max_steps=3",
            "+cell=x",
            "~trainer.peak_tflops",
            "hydra.run.dir=/tmp/x",
            "data.data_files=[a,b]",
            "optim.lr=1e-3",
            "logger.wandb=disabled",
            "--multirun",
            "seed=3",
            "resume=latest",
            "model.norm=rmsnorm,layernorm",
            "trainer.time_budget=null",
        ]
    )


def test_train_py_refuses_a_mistyped_key_in_one_line_before_hydra():
    result = forked.run_script(TRAIN_PY, "model.hidden_sise=128")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: model.hidden_sise is not a setting (model has no 'hidden_sise'); "
        "did you mean model.hidden_size? README's configuration table lists every "
        "setting"
    ]


def test_train_py_refuses_an_option_no_config_group_holds_in_one_line(tmp_path):
    result = forked.run_script(TRAIN_PY, "model=25M", f"outputs_dir={tmp_path}")
    assert result.returncode == 1 and result.stdout == "" and not any(tmp_path.iterdir())
    assert result.stderr.splitlines() == [
        "error: model=25M is no option of the config group model; did you mean model=25m? its options are 125m, 25m, "
        "cpu, tiny"
    ]


@pytest.mark.parametrize(
    "arg, said",
    [
        ("optim=adam", "optim=adam is no option of the config group optim; did you mean optim=adamw? its options are "),
        ("model=25m,12m", "model=12m is no option of the config group model; did you mean model=125m?"),  # a sweep
        ("experiment=nonexistent", "experiment=nonexistent is no option of the config group experiment; its options"),
    ],
)
def test_a_mistyped_group_option_is_one_line_naming_the_options(arg, said):
    with pytest.raises(ConfigError) as raised:
        check_override_keys([arg])
    assert str(raised.value).startswith(said) and "\n" not in str(raised.value)
    options = sorted(p.stem for p in (CONFIGS / arg.split("=")[0]).glob("*.yaml"))
    assert str(raised.value).endswith(f"its options are {', '.join(options)}")


def test_a_groups_options_are_those_on_hydras_search_path(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    check_override_keys([searchpath, "experiment=mine", "experiment=null", "model=glob(*)"])
    with pytest.raises(ConfigError, match=r"did you mean experiment=mine\? its options are .*\bmine\b"):
        check_override_keys([searchpath, "experiment=mien"])
    with pytest.raises(ConfigError, match="experiment=mine is no option"):
        check_override_keys(["experiment=mine"])  # not on the search path without the override
    check_override_keys(["--config-dir", str(tmp_path), "experiment=mine"])  # another config folder: Hydra's to judge


@pytest.mark.parametrize(
    "arg, said",
    [
        ("optim.lr=abc", "optim.lr=abc: optim.lr takes a number, not 'abc'"),
        ("trainer.max_steps=2.5", "trainer.max_steps=2.5: trainer.max_steps takes an integer, not '2.5'"),
        ("trainer.keep_best=maybe", "trainer.keep_best=maybe: trainer.keep_best takes true or false, not 'maybe'"),
        ("seed=x", "seed=x: seed takes an integer, not 'x'"),
        ("trainer.time_budget=soon", "trainer.time_budget=soon: trainer.time_budget takes a number, not 'soon'"),
    ],
)
def test_a_value_of_the_wrong_type_is_one_line_naming_the_type(arg, said):
    with pytest.raises(ConfigError) as raised:
        check_override_keys(["model=cpu", arg])
    assert str(raised.value) == said


def test_train_py_refuses_a_value_of_the_wrong_type_in_one_line_before_hydra(tmp_path):
    result = forked.run_script(TRAIN_PY, "optim.muon_ns_steps=abc", f"outputs_dir={tmp_path}")
    assert result.returncode == 1 and result.stdout == "" and not any(tmp_path.iterdir())
    assert result.stderr.splitlines() == [
        "error: optim.muon_ns_steps=abc: optim.muon_ns_steps takes an integer, not 'abc'"
    ]


def test_train_help_lists_the_groups_train_py_uses_and_their_every_option():
    """`python train.py --help` (configs/train.yaml's hydra.help) lists each group train.py composes with every
    option on disk — not protocol/ and speedrun/, which ablate.py and speedrun.py read — and prints the config."""
    import yaml

    root = Path(__file__).resolve().parents[1]
    template = yaml.safe_load((root / "configs" / "train.yaml").read_text())["hydra"]["help"]["template"]
    listed = dict(
        line.split(": ", 1) for line in template.splitlines() if ": " in line and line.split(": ")[0].isidentifier()
    )
    on_disk = {
        group.name: {p.stem for p in group.glob("*.yaml")}
        for group in (root / "configs").iterdir()
        if group.is_dir() and group.name not in ("protocol", "speedrun")
    }
    assert {group: set(options.split(", ")) - {"null"} for group, options in listed.items()} == on_disk
    proc = forked.run_script(TRAIN_PY, "--help")
    assert (
        proc.returncode == 0 and "\nmodel: cpu, tiny, 25m, 125m\n" in proc.stdout and "\nprotocol: " not in proc.stdout
    )
    assert "hidden_size: 192" in proc.stdout  # the composed config follows


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_study_preset_pins_its_data_order(experiment):
    """The studies' published runs drew windows at random (data.sampling=random); the default is now epochs. A
    preset that did not pin its order would change its study's data under it (and refuse its own resumes)."""
    assert compose_train_config([])[0].data.sampling == "epochs"
    assert compose_train_config([f"experiment={experiment}"])[0].data.sampling == "random"


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_study_preset_pins_the_kernels_its_published_runs_used(experiment):
    """The default that changed a compiled CPU step's numbers since the studies ran — Muon's Newton–Schulz in bf16 on
    bf16 CPUs (optim.muon_ns_dtype=auto) — is pinned back in every study preset, so a rerun computes what its
    published runs did. (Their attention is SDPA's, the only attention there is since model.attention_kernel went.)"""
    cfg = compose_train_config([f"experiment={experiment}"])[0]
    assert cfg.optim.muon_ns_dtype == "fp32"
    assert compose_train_config([])[0].optim.muon_ns_dtype == "auto"
    assert not hasattr(cfg.model, "attention_kernel")
    assert "attention_kernel" not in (CONFIGS / "experiment" / f"{experiment}.yaml").read_text()
