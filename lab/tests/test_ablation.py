"""The ablation experiments: every cell composes alike, a sweep runs and compares end to end, and the
default protocol of lab/ablate.py composes in every cell with its parameters matched."""

import functools
import itertools
import json
import signal
import sys

import pytest
import torch
import yaml
from matplotlib import image

from lab import CONFIGS, SEARCH_PATH
from lab.ablate import DEFAULT_PROTOCOL
from lab.ablation.configs import apply_transfer, validate
from lab.ablation.protocol import ProtocolError, Spec, load_spec_file
from model import Transformer
from tests import forked
from tests.train_helpers import GIVEN_PEAK, REPO, interrupt_once_training, launch, read_metrics
from training.program import compose, compose_train_config


def compose_typed(overrides: list):
    """The typed config train.py would run with these overrides, the lab's presets on Hydra's search path."""
    return compose_train_config([SEARCH_PATH, *overrides])[0]


def sweep_grid(experiment: str) -> dict:
    """The experiment's hydra.sweeper.params as composed (an experiment may inherit them)."""
    cfg = compose([f"experiment={experiment}"], keep_hydra=True)
    return {key: str(values).split(",") for key, values in cfg.hydra.sweeper.params.items()}


GRIDS = {
    "ablation_norm_mlp": {"seed": ["0", "1"], "model.norm": ["rmsnorm", "layernorm"], "model.mlp": ["swiglu", "gelu"]},
    "ablation_mlp_zoo": {
        "seed": ["0", "1"],
        "model.norm": ["rmsnorm"],
        "model.mlp": ["swiglu", "geglu", "gelu", "relu2"],
    },
}


@pytest.mark.parametrize("experiment", GRIDS)
def test_grid_is_the_documented_one(experiment):
    assert sweep_grid(experiment) == GRIDS[experiment]


@pytest.mark.parametrize("experiment", GRIDS)
def test_every_cell_composes_and_differs_only_in_norm_mlp_and_seed(experiment):
    grid, shared, counts = GRIDS[experiment], None, {}
    for values in itertools.product(*grid.values()):
        cell = dict(zip(grid, values))
        cfg = compose_typed([f"experiment={experiment}"] + [f"{k}={v}" for k, v in cell.items()])
        assert (cfg.model.norm, cfg.model.mlp, str(cfg.seed)) == (cell["model.norm"], cell["model.mlp"], cell["seed"])
        assert list(cfg.logger.tags) == [experiment, f"norm={cfg.model.norm}", f"mlp={cfg.model.mlp}"]
        assert cfg.logger.group and "${" not in cfg.logger.group
        assert cfg.run_name == f"{cfg.model.norm}_{cfg.model.mlp}_seed{cfg.seed}"
        with torch.device("meta"):
            counts[cfg.model.norm, cfg.model.mlp] = Transformer(cfg.model).param_counts()
        # Same data, token budget and LR schedule in every cell: trainer, optim and data are identical.
        same = (cfg.trainer, cfg.optim, cfg.data, cfg.model.hidden_size, cfg.model.n_layers)
        assert shared is None or same == shared
        shared = same
    assert shared[0].max_steps * shared[0].micro_batch_size * shared[0].seq_len >= 1_000_000  # a real budget
    # Parameters matched: a 4·d MLP has 8·d² per layer; SwiGLU's 3·d·I with I = 8d/3 rounded up to
    # multiple_of m has at most 3·d·m more. LayerNorm adds only a bias per norm (2L + 1 norms).
    d, layers, m = shared[3], shared[4], cfg.model.multiple_of
    for (norm, mlp), c in counts.items():
        reference = counts[norm, "swiglu"]
        assert abs(c["mlp"] - reference["mlp"]) <= 3 * d * m * layers, (norm, mlp)
        assert c["attention"] == reference["attention"] and c["embedding"] == reference["embedding"]
        if norm == "layernorm":
            assert c["total"] - counts["rmsnorm", mlp]["total"] == (2 * layers + 1) * d


ABLATION_PRESETS = sorted(
    p.stem for folder in (REPO / "configs", CONFIGS) for p in (folder / "experiment").glob("ablation_*.yaml")
)
SHAPE = ("hidden_size", "n_layers", "n_heads", "n_kv_heads", "multiple_of", "max_seq_len", "norm", "mlp", "qk_norm")


def shape(cfg) -> tuple:
    return tuple(getattr(cfg.model, k) for k in SHAPE) + (cfg.model.resolved_intermediate_size,)


@pytest.mark.parametrize("preset", ABLATION_PRESETS)
def test_every_ablation_preset_pins_its_model_shape(preset):
    """Whatever model group is chosen — today's default or any other — the preset trains the same shape:
    a new configs/model/cpu.yaml (6 → 1 layer, as happened) never changes a study again."""
    models = sorted(p.stem for p in (REPO / "configs" / "model").glob("*.yaml"))
    shapes = {model: shape(compose_typed([f"model={model}", f"experiment={preset}"])) for model in models}
    assert len(set(shapes.values())) == 1, shapes
    assert "protocol" in preset or "epoch" in preset or shapes["cpu"][:3] == (256, 6, 4)  # the published table's


def test_scaling_up_takes_a_protocol_file_not_the_cpu_preset():
    """The GPU protocol composes without a CPU preset, so model=25m is what it trains."""
    spec = load_spec_file(DEFAULT_PROTOCOL.parent / "gpu_25m.yaml")
    assert spec.experiment is None
    cfg = compose_typed([*spec.train_overrides])
    assert (cfg.model.hidden_size, cfg.trainer.max_steps, cfg.data.source) == (512, 5000, "tinystories")


def test_the_epoch_preset_trains_one_epoch_and_scores_the_whole_split():
    cfg = compose_typed(["experiment=ablation_epoch"])
    shakespeare_train_tokens = 1_995_265  # at vocab 1024: scripts/prepare_data.py experiment=ablation_epoch
    t = cfg.trainer
    assert cfg.data.vocab_size == 1024 and cfg.data.source == "shakespeare"
    assert shakespeare_train_tokens <= t.max_steps * t.micro_batch_size * t.seq_len < 1.01 * shakespeare_train_tokens
    assert t.num_eval_windows is None  # eval_windows=all: every validation token, not a sample
    assert t.eval_interval % t.log_interval == 0 and t.max_steps % t.eval_interval == 0
    assert shape(cfg) == shape(compose_typed(["experiment=ablation_protocol"]))  # the first protocol's model


def sweep(tmp_path, cache_dir, *overrides, check=True, popen=False):
    args = [
        "-m",
        "debug=tiny",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        f"data.cache_dir={cache_dir}",
        "trainer.num_threads=1",
        GIVEN_PEAK,
        *overrides,
    ]
    return launch([sys.executable], args, check=check, popen=popen)


@pytest.fixture(scope="module")
def cache_dir(tiny_data_cache):
    return tiny_data_cache  # debug=tiny's data, prepared once per session (tests/fixtures.py)


@pytest.mark.serial
def test_sweep_runs_the_grid_and_compare_runs_judges_it(tmp_path, cache_dir):
    """`-m experiment=ablation_norm_mlp` alone makes the grid (seed pinned to 0 here: 2×2×1)."""
    # The preset pins its shape (256 × 6, whatever model group is chosen): a smoke run shrinks it explicitly.
    tiny_shape = [
        "model.hidden_size=64",
        "model.n_layers=2",
        "model.n_heads=4",
        "model.n_kv_heads=2",
        "model.multiple_of=16",
        "model.max_seq_len=64",
    ]
    sweep(
        tmp_path,
        cache_dir,
        "experiment=ablation_norm_mlp",
        "seed=0",
        "trainer.max_steps=4",
        "trainer.eval_interval=2",
        *tiny_shape,
    )
    runs = sorted((tmp_path / "sweep").glob("*/metrics.jsonl"))
    assert len(runs) == 4  # one directory level: no path-valued override nests the job directories
    configs = [yaml.safe_load((r.parent / "config.yaml").read_text()) for r in runs]
    assert {(c["model"]["norm"], c["model"]["mlp"]) for c in configs} == {
        (n, m) for n in ("rmsnorm", "layernorm") for m in ("swiglu", "gelu")
    }
    # One wandb group per sweep: every job names the same one, the sweep's directory.
    assert {c["logger"]["group"] for c in configs} == {str(tmp_path / "sweep")}
    for run in runs:
        evals = [r for r in read_metrics(run.parent) if r["kind"] == "eval"]
        assert [e["step"] for e in evals] == [2, 4] and len(evals[-1]["rms_residual"]) == 2
    proc = forked.run_script(REPO / "scripts" / "compare_runs.py", tmp_path / "sweep")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "sweep" / "comparison"
    results, paired = (out / "results.md").read_text().split("## Paired Δ against the reference")
    table = [line for line in results.splitlines() if line.startswith("| ")][1:]
    assert len(table) == 4 and sum("★" in line for line in table) == 1
    assert all(("| 176 |" in line) == ("swiglu" in line) for line in table)  # 8/3·64 rounded up to 16s; gelu: 256
    vs_reference = [line for line in paired.splitlines() if line.startswith("| ") and "+" in line.split(" | ")[0]]
    assert len(vs_reference) == 3  # every variant but rmsnorm + swiglu, paired over the one seed
    for name in ("val_curves.png", "activation_rms.png"):
        assert image.imread(out / name).ndim == 3
    assert not (out / "forest.png").exists()  # one seed: no interval to draw


@pytest.mark.serial
def test_a_failed_cell_does_not_cancel_the_sweep(tmp_path, cache_dir):
    proc = sweep(tmp_path, cache_dir, "model.n_heads=3,4", "trainer.max_steps=2", check=False)
    assert proc.returncode == 1
    assert "error: model.hidden_size=64 is not divisible by model.n_heads=3" in proc.stderr
    assert "Error executing job with overrides" in proc.stderr and "Traceback" not in proc.stderr
    (done,) = (tmp_path / "sweep").glob("*/metrics.jsonl")
    assert "n_heads=4" in done.parent.name


@pytest.mark.serial
def test_ctrl_c_stops_the_whole_sweep_after_a_checkpoint(tmp_path, cache_dir):
    proc = sweep(
        tmp_path,
        cache_dir,
        "model.mlp=swiglu,gelu",
        "trainer.max_steps=100000",
        "trainer.eval_interval=100000",
        "trainer.ckpt_interval=100000",
        popen=True,
    )
    out, err = interrupt_once_training(proc, tmp_path / "sweep", "*/metrics.jsonl", signal.SIGINT)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "SIGINT: checkpoint saved" in out and "sweep stopped" in out
    (job,) = (tmp_path / "sweep").glob("*/checkpoints")  # the second job never started
    assert "swiglu" in job.parent.name and json.loads(next(job.glob("*/state.json")).read_text())["step"] > 0


def test_protocol_preset_is_the_documented_cpu_budget():
    cfg = compose_typed(["experiment=ablation_protocol"])
    assert (cfg.model.hidden_size, cfg.model.n_layers, cfg.model.n_heads, cfg.trainer.seq_len) == (96, 4, 2, 128)
    assert (cfg.trainer.max_steps, cfg.trainer.micro_batch_size, cfg.data.vocab_size) == (150, 16, 1024)
    # Evals on log boundaries: a log interval that spans an eval would overstate tokens/s.
    assert cfg.trainer.eval_interval % cfg.trainer.log_interval == 0
    assert cfg.trainer.max_steps % cfg.trainer.eval_interval == 0 and cfg.trainer.sample_tokens == 0


@functools.lru_cache(maxsize=None)
def validated(path):
    """(spec, models, budgets) of a protocol file; composing every cell takes seconds, so once."""
    spec = load_spec_file(path)
    apply_transfer(spec, compose_typed)  # as cli/ablate.py's open_protocol does, before validating
    return (spec, *validate(spec, compose_typed))  # raises, naming the cell, if one does not compose or build


@pytest.mark.parametrize("protocol", sorted(p.name for p in DEFAULT_PROTOCOL.parent.glob("*.yaml")))
def test_every_protocol_file_composes_in_every_cell_and_preregisters_its_analysis(protocol):
    spec, models, budgets = validated(DEFAULT_PROTOCOL.parent / protocol)
    assert set(models) == set(spec.sizes) and all(set(m) == set(spec.variants_at(s)) for s, m in models.items())
    assert spec.stage1_seed not in spec.seeds and len(spec.seeds) >= 3  # LR chosen apart from the measurements
    grid = spec.lr_grid
    assert len(grid) == 5 and all(b / a == pytest.approx(2.0) for a, b in zip(grid, grid[1:])) and spec.lr_extensions
    assert spec.primary == ["layernorm", "gelu"] and set(spec.secondary) == {"no_norm", "qk_norm", "rmsnorm_bf16"}
    assert (spec.multitest, spec.alpha, spec.equivalence_margin, spec.target_mde) == ("holm", 0.05, 0.01, 0.02)
    assert {spec.variants[v][0] for v in spec.primary} == {"model.norm=layernorm", "model.mlp=gelu"}


def test_every_cell_of_the_default_protocol_composes_with_parameters_matched():
    """All cells compose and build (the protocol checks the same before training): 6 variants at d2, the
    reference and the primaries at d6, width fixed; the parameter columns show what each variant changes."""
    spec, models, budgets = validated(DEFAULT_PROTOCOL)
    assert spec.reference == "rmsnorm_swiglu" and set(models["d2"]) == {
        "rmsnorm_swiglu",
        "layernorm",
        "no_norm",
        "rmsnorm_bf16",
        "qk_norm",
        "gelu",
    }
    assert set(models["d6"]) == {"rmsnorm_swiglu", "layernorm", "gelu"}
    for size, m in models.items():
        ref = m["rmsnorm_swiglu"]
        assert m.get("rmsnorm_bf16", ref) == ref  # the same weights; only the norm's arithmetic differs
        assert m.get("no_norm", {"total": 0})["total"] < ref["total"] < m["layernorm"]["total"] <= ref["total"] * 1.01
        assert abs(m["gelu"]["mlp"] - ref["mlp"]) / ref["mlp"] < 0.03  # 4·d vs 3 × 8/3·d: matched
        assert budgets[size].max_steps == 980
    assert models["d2"]["qk_norm"]["mlp"] == models["d2"]["rmsnorm_swiglu"]["mlp"]
    layer = (models["d6"]["rmsnorm_swiglu"]["total"] - models["d2"]["rmsnorm_swiglu"]["total"]) / 4
    assert layer == 4 * 96 * 96 + 3 * 96 * 256 + 2 * 96  # one block: q, k, v, o; SwiGLU's three; two RMSNorm weights


def test_the_stored_planning_spread_is_the_first_protocols_measured_one():
    """default.yaml's planning_sd is traceable: pooled per-seed paired differences of its primaries in the
    stored manifest of the first protocol run."""
    from lab.ablation.runner import spread_from

    spec = load_spec_file(DEFAULT_PROTOCOL)
    sd, dof, source = spread_from(REPO / "docs" / "ablation" / "protocol" / "protocol.yaml", ["layernorm", "gelu"])
    assert spec.planning_sd == pytest.approx(sd, abs=5e-6) and dof == 16
    assert "layernorm" in spec.planning_sd_source and "16 dof" in spec.planning_sd_source
    assert spec.seeds == [0, 1, 2, 3, 4] and spec.planned_seed_count() == (5, 33)  # capped by the budget, and says so


def test_transfer_from_trains_every_cell_under_mup_based_at_that_width():
    """width_mup.yaml: the LR sweep at w96 only; every cell, w384's too, under μP with base width 96."""
    spec, models, budgets = validated(DEFAULT_PROTOCOL.parent / "width_mup.yaml")
    assert spec.transfer_from == "w96" and spec.sweep_sizes == ["w96"]
    assert {"model.parametrization=mup", "model.mup_base_width=96"} <= set(spec.train_overrides)
    cfg = compose_typed(
        [f"experiment={spec.experiment}", *spec.train_overrides, *spec.sizes["w384"], "model.norm=layernorm"]
    )
    assert (cfg.model.parametrization, cfg.model.mup_base_width, cfg.model.hidden_size, cfg.model.n_layers) == (
        "mup",
        96,
        384,
        2,
    )
    assert models["w384"]["rmsnorm_swiglu"]["total"] > models["w96"]["rmsnorm_swiglu"]["total"]


def test_transfer_from_refuses_a_depth_ladder_and_keeps_a_base_width_it_is_given():
    depth = Spec(**{**load_spec_file(DEFAULT_PROTOCOL).to_dict(), "transfer_from": "d2"})
    with pytest.raises(
        ProtocolError,
        match=r"differ in depth \(n_layers d2=2, d6=6\); μP transfers the LR across "
        r"width only",
    ) as e:
        apply_transfer(depth, compose_typed)
    assert "\n" not in str(e.value)
    width = load_spec_file(DEFAULT_PROTOCOL.parent / "width_mup.yaml")
    width.train_overrides = [*width.train_overrides, "model.mup_base_width=192"]  # the user's base: μP equals SP there
    apply_transfer(width, compose_typed)
    assert width.train_overrides[-2:] == ["model.mup_base_width=192", "model.parametrization=mup"]
