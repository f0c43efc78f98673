"""lab/ablation/registration.py: the protocol manifest round-trips, and a resume may add cells but never
change what an existing name means."""

import pytest

from lab.ablation import registration
from lab.ablation.protocol import ProtocolError, Spec


def spec(**changes) -> Spec:
    fields = dict(
        variants={"ref": [], "gelu": ["model.mlp=gelu"]},
        reference="ref",
        lr_grid=[1e-3, 1e-2],
        seeds=[0, 1],
        sizes={"small": []},
        experiment="ablation_protocol",
        train_overrides=["trainer.max_steps=100", "data.cache_dir=/a"],
    )
    return Spec(**{**fields, **changes})


def test_round_trip_and_no_leftover_temp_file(tmp_path):
    manifest = {"spec": spec().to_dict(), "chosen_lr": {"small": {"ref": 1e-3, "gelu": None}}}
    registration.register(manifest, spec(), "ablate.py", {})
    registration.save(tmp_path, manifest)
    loaded = registration.load(tmp_path)
    assert registration.spec_of(loaded) == spec() and loaded["chosen_lr"]["small"] == {"ref": 1e-3, "gelu": None}
    assert [p.name for p in tmp_path.iterdir()] == [registration.MANIFEST]
    assert registration.load(tmp_path / "nothing_here") is None


def test_an_unreadable_manifest_is_a_one_line_error(tmp_path):
    (tmp_path / registration.MANIFEST).write_text("spec: [unclosed")
    with pytest.raises(ProtocolError, match="cannot read"):
        registration.load(tmp_path)
    for old in ("format: 99\nspec: {}\n", "format: 2\nspec: {}\n"):  # the second: from before registration existed
        (tmp_path / registration.MANIFEST).write_text(old)
        with pytest.raises(ProtocolError, match="not a protocol manifest of this version"):
            registration.load(tmp_path)


def test_identity_ignores_paths_threads_and_logging():
    assert registration.identity(
        ["data.cache_dir=/x", "trainer.num_threads=2", "logger.wandb=offline", "trainer.max_steps=100", "seed=3"]
    ) == ["trainer.max_steps=100"]


def test_a_new_variant_may_join_the_secondary_family_but_none_may_leave_it(tmp_path):
    three = {"ref": [], "gelu": ["model.mlp=gelu"], "ln": ["model.norm=layernorm"]}
    registration.check_continuable(spec(), spec(variants=three), tmp_path)  # ln joins the secondaries
    with pytest.raises(ProtocolError, match="ln among the secondary contrasts; a new variant may join"):
        registration.check_continuable(spec(variants=three), spec(), tmp_path)  # e.g. --variants ref,gelu


@pytest.mark.parametrize(
    "changes",
    [
        {"seeds": [0, 1, 2, 3]},
        {"lr_grid": [1e-3, 1e-2, 3e-2]},
        {"variants": {"ref": [], "gelu": ["model.mlp=gelu"], "ln": ["model.norm=layernorm"]}},
        {"sizes": {"small": [], "wide": ["model.hidden_size=128"]}},
        {"train_overrides": ["data.cache_dir=/elsewhere", "trainer.max_steps=100"]},
    ],
)
def test_a_resume_may_add_cells_or_move_paths(tmp_path, changes):
    registration.check_continuable(spec(), spec(**changes), tmp_path)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"train_overrides": ["trainer.max_steps=200"]}, "train.py overrides trainer.max_steps=100"),
        ({"experiment": None}, "experiment=ablation_protocol"),
        ({"min_lr_ratio": 0.5}, "min_lr_ratio=0.1"),
        ({"variants": {"ref": [], "gelu": ["model.mlp=relu2"]}}, "variant gelu = model.mlp=gelu, not model.mlp=relu2"),
        ({"primary": ["gelu"]}, "primary contrasts (none), not gelu"),
        ({"equivalence_margin": 0.02}, "equivalence_margin=0.01, not 0.02"),
        ({"alpha": 0.1}, "alpha=0.05, not 0.1"),
        ({"multitest": "bonferroni"}, "multitest=holm"),
        ({"stage1_seed": 7}, "stage1_seed=100, not 7"),
        ({"lr_extensions": 0}, "lr_extensions=2"),
        ({"reference": "gelu"}, "reference=ref, not gelu"),
    ],
)
def test_a_resume_must_not_redefine_what_ran(tmp_path, changes, message):
    with pytest.raises(ProtocolError, match="was started with") as e:
        registration.check_continuable(spec(), spec(**changes), tmp_path / registration.MANIFEST)
    assert message in str(e.value)
