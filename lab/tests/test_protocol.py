"""lab/ablation/protocol.py: the spec's checks (the pre-registration among them), the cells of each
stage, and the LR choice."""

import math

import pytest
import yaml

from lab.ablation.lr_search import at_grid_edge, choose_lr
from lab.ablation.protocol import (
    Cell,
    ProtocolError,
    Spec,
    load_spec_file,
    merge_overrides,
    parse_sizes,
    split_overrides,
    stage1_cells,
    stage2_cells,
)


def spec(**changes) -> Spec:
    fields = dict(
        variants={"ref": [], "gelu": ["model.mlp=gelu"]},
        reference="ref",
        lr_grid=[1e-3, 1e-2],
        seeds=[0, 1, 2],
        sizes={"small": [], "wide": ["model.hidden_size=128"]},
    )
    return Spec(**{**fields, **changes})


def test_stage1_is_every_variant_at_every_lr_and_size_with_one_seed():
    cells = stage1_cells(spec(stage1_seed=7))
    assert len(cells) == 2 * 2 * 2 and {c.seed for c in cells} == {7}
    assert {(c.size, c.variant, c.lr) for c in cells} == {
        (s, v, lr) for s in ("small", "wide") for v in ("ref", "gelu") for lr in (1e-3, 1e-2)
    }


def test_stage2_is_each_variant_at_its_own_lr_and_at_the_references_on_every_seed_seeds_outermost():
    chosen = {"small": {"ref": 1e-2, "gelu": 1e-3}, "wide": {"ref": 1e-3, "gelu": None}}  # gelu diverged at wide
    cells = stage2_cells(spec(), chosen)
    by_seed = {(c.size, c.variant, c.lr) for c in cells if c.seed == 0}
    assert by_seed == {
        ("small", "ref", 1e-2),
        ("small", "gelu", 1e-3),
        ("small", "gelu", 1e-2),  # own and shared
        ("wide", "ref", 1e-3),
        ("wide", "gelu", 1e-3),
    }  # no own LR at wide: the shared one only
    assert len(cells) == 5 * 3 and {c.seed for c in cells} == {0, 1, 2}
    assert [c.seed for c in cells] == sorted(c.seed for c in cells)  # a stopped stage holds whole seeds
    same = stage2_cells(spec(), {"small": {"ref": 1e-2, "gelu": 1e-2}})  # own LR = the reference's: one cell
    assert len(same) == 2 * 3
    assert stage2_cells(spec(), {"small": {"gelu": 1e-3}}) == [Cell("small", "gelu", 1e-3, s) for s in (0, 1, 2)]


def test_the_lr_is_never_chosen_on_a_measuring_seed():
    s = spec()
    chosen = {"small": {"ref": 1e-2, "gelu": 1e-3}, "wide": {"ref": 1e-3, "gelu": 1e-2}}
    assert s.stage1_seed not in s.seeds and not set(stage1_cells(s)) & set(stage2_cells(s, chosen))
    with pytest.raises(ProtocolError, match="stage1_seed=1 is also a measuring seed"):
        spec(stage1_seed=1)


def test_stage1_adds_the_extensions_its_results_call_for():
    s = spec(lr_grid=[1e-3, 2e-3, 4e-3], sizes={"small": []})
    done = {Cell("small", "ref", lr, s.stage1_seed): bpb for lr, bpb in ((1e-3, 2.3), (2e-3, 2.2), (4e-3, 2.1))}
    cells = stage1_cells(s, done)
    assert Cell("small", "ref", 8e-3, s.stage1_seed) in cells and len(cells) == 3 + 1 + 3  # ref's edge; gelu's grid
    assert Cell("small", "gelu", 8e-3, s.stage1_seed) not in cells  # gelu has no results yet: no extension


def test_seeds_auto_plans_the_seeds_the_target_needs_within_the_cap():
    planned = spec(seeds="auto", primary=["gelu"], planning_sd=0.01, target_mde=0.02, sizes={"small": []})
    assert planned.seeds == list(range(planned.planned_seed_count()[1])) and len(planned.seeds) >= 3
    capped = spec(seeds="auto", primary=["gelu"], planning_sd=0.0327, max_seeds=6)
    assert capped.seeds == list(range(6)) and capped.planned_seed_count()[1] > 6
    assert capped.family_alpha("primary") == pytest.approx(0.05 / 2)  # 1 contrast × 2 sizes
    with pytest.raises(ProtocolError, match="seeds: auto needs planning_sd"):
        spec(seeds="auto")


def test_the_preregistration_names_each_contrasts_family():
    s = spec(
        variants={"ref": [], "gelu": ["model.mlp=gelu"], "ln": ["model.norm=layernorm"], "none": ["model.norm=none"]},
        primary=["gelu", "ln"],
    )
    assert s.secondary == ["none"] and s.family("primary") == ["gelu", "ln"]  # the rest is secondary
    assert s.family_alpha("secondary") == pytest.approx(0.05 / 2) and s.family_alpha("primary") == pytest.approx(
        0.05 / 4
    )


def test_choose_lr_takes_the_lowest_finite_bpb():
    assert choose_lr({1e-3: 2.10, 3e-3: 2.05, 1e-2: 2.07}) == 3e-3
    assert choose_lr({1e-3: 2.10, 3e-3: None, 1e-2: float("nan")}) == 1e-3  # diverged / non-finite never win
    assert choose_lr({1e-3: None, 3e-3: None}) is None
    assert choose_lr({1e-3: 2.0, 3e-3: 2.0}) == 1e-3  # a tie goes to the smaller, safer LR


def test_grid_edge():
    grid = [1e-3, 3e-3, 1e-2]
    assert at_grid_edge(1e-3, grid) and at_grid_edge(1e-2, grid) and not at_grid_edge(3e-3, grid)
    assert not at_grid_edge(1e-3, [1e-3])


def test_cell_names_are_directories_and_hydra_options():
    cells = [Cell("h96", "no_norm", lr, 3) for lr in (1e-3, 0.001001, 3e-3, 1e30, 1e-5)]
    assert cells[0].run_name == "h96/no_norm/lr0.001_seed3"
    options = [c.option for c in cells]
    assert len(set(options)) == len(options)
    assert all(set(o) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") for o in options)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"reference": "nope"}, "reference 'nope' is not among the variants"),
        ({"variants": {"ref": [], "no=rm": []}, "reference": "ref"}, "variant name 'no=rm'"),
        ({"sizes": {"a/b": []}}, "size name 'a/b'"),
        ({"lr_grid": [1e-3, -1.0]}, "positive, finite"),
        ({"lr_grid": [1e-3, math.inf]}, "positive, finite"),
        ({"lr_grid": [1e-3, 1e-3]}, "repeats"),
        ({"seeds": [0, 0]}, "distinct"),
        ({"seeds": []}, "distinct"),
        ({"min_lr_ratio": 2.0}, "min_lr_ratio=2.0"),
        ({"variants": {"ref": [], "big": ["model=25m"]}}, "config groups"),
        ({"variants": {"ref": [], "fast": ["optim.lr=1"]}}, "optim.lr is set by the protocol"),
        ({"variants": {"ref": [], "odd": ["model.norm"]}}, "not a value override"),
        ({"primary": ["ref"]}, "primary: ref not among the variants other than the reference"),
        ({"primary": ["gelu"], "secondary": ["gelu"]}, "gelu both primary and secondary"),
        ({"variants": {"ref": [], "a": [], "b": []}, "primary": ["a"], "secondary": ["a2"]}, "secondary: a2 not among"),
        (
            {"variants": {"ref": [], "a": [], "b": [], "c": []}, "primary": ["a"], "secondary": ["c"]},
            "b in neither primary nor secondary",
        ),
        (
            {
                "variants": {"ref": [], "a": ["model.norm=none"], "b": ["model.mlp=gelu"]},
                "primary": ["a"],
                "secondary": [],
            },
            None,
        ),
        ({"alpha": 0.7}, "alpha=0.7"),
        ({"multitest": "fdr_bh"}, "multitest='fdr_bh' must be one of holm"),
        ({"equivalence_margin": 0}, "equivalence_margin=0"),
        ({"power": 1.0}, "power=1.0"),
        ({"lr_extensions": -1}, "lr_extensions=-1"),
        ({"seeds": "all"}, "seeds='all' must be a list"),
        ({"transfer_from": "huge"}, "transfer_from='huge' is not a size (small, wide)"),
        (
            {"transfer_from": "wide", "variant_sizes": {"gelu": ["small"]}},
            "transfer_from=wide: gelu never run(s) there",
        ),
        (
            {"transfer_from": "small", "train_overrides": ["model.parametrization=sp"]},
            "transfer_from needs model.parametrization=mup, but train_overrides sets model.parametrization=sp",
        ),
        (
            {"transfer_from": "small", "variants": {"ref": [], "gelu": ["model.parametrization=sp"]}},
            "but gelu sets model.parametrization=sp",
        ),
    ],
)
def test_bad_specs_are_one_line_errors(changes, message):
    if message is None:  # fine: an empty secondary means every other variant
        assert spec(**changes).secondary == ["b"]
        return
    with pytest.raises(ProtocolError, match=None) as e:
        spec(**changes)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_parse_sizes_zips_sweep_terms():
    assert parse_sizes(["model.hidden_size=96,192", "model.n_heads=2,4"]) == {
        "hidden_size96_n_heads2": ["model.hidden_size=96", "model.n_heads=2"],
        "hidden_size192_n_heads4": ["model.hidden_size=192", "model.n_heads=4"],
    }
    with pytest.raises(ProtocolError, match="same number of values"):
        parse_sizes(["model.hidden_size=96,192", "model.n_heads=2"])
    with pytest.raises(ProtocolError, match="is not key.sub=v1,v2"):
        parse_sizes(["hidden_size"])


def test_spec_file_round_trip_and_unknown_fields(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec().to_dict()))
    assert load_spec_file(path) == spec()
    path.write_text(yaml.safe_dump({**spec().to_dict(), "lr_gird": [1]}))
    with pytest.raises(ProtocolError, match="unknown field.*lr_gird"):
        load_spec_file(path)
    with pytest.raises(ProtocolError, match="cannot read protocol file"):
        load_spec_file(tmp_path / "missing.yaml")


def test_launcher_overrides_are_kept_apart_and_later_overrides_win():
    train, launcher = split_overrides(
        [
            "trainer.max_steps=5",
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.partition=gpu",
            "+hydra.job.env_set.X=1",
            "logger=none",
        ]
    )
    assert train == ["trainer.max_steps=5", "logger=none"]
    assert launcher == ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu", "+hydra.job.env_set.X=1"]
    assert merge_overrides(
        ["model=25m", "trainer.max_steps=5", "data.cache_dir=/a"], ["data.cache_dir=/b", "trainer.num_threads=2"]
    ) == ["model=25m", "trainer.max_steps=5", "data.cache_dir=/b", "trainer.num_threads=2"]


def test_transfer_from_sweeps_lrs_at_one_size_and_every_size_measures_at_them():
    """μP transfer: stage 1 only at the transfer size; stage 2 at every size, at the LRs chosen there."""
    s = spec(transfer_from="small", stage1_seed=7)
    assert s.sweep_sizes == ["small"] and spec().sweep_sizes == ["small", "wide"]
    cells = stage1_cells(s)
    assert {(c.size, c.variant, c.lr) for c in cells} == {
        ("small", v, lr) for v in ("ref", "gelu") for lr in (1e-3, 1e-2)
    }
    chosen = {"small": {"ref": 1e-2, "gelu": 1e-3}, "wide": {"ref": 1e-2, "gelu": 1e-3}}  # what cells.chosen_lrs gives
    assert {(c.size, c.variant, c.lr) for c in stage2_cells(s, chosen) if c.seed == 0} == {
        (size, v, lr) for size in ("small", "wide") for v, lr in (("ref", 1e-2), ("gelu", 1e-3), ("gelu", 1e-2))
    }
