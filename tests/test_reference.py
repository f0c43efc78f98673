"""analysis/reference.py: which variant is each variant's reference (the rest of the paired table is
tested through scripts/compare_runs.py in test_compare_runs.py)."""

import pytest

from analysis.reference import DEFAULT_REFERENCE, parse_reference, references_by_config
from analysis.runs import RunsError, group_variants, read_run
from tests.run_helpers import write_run


def variants(tmp_path, specs):
    runs = [read_run(write_run(tmp_path, f"r{i}", **kwargs)) for i, kwargs in enumerate(specs)]
    return {v.label: v for v in group_variants(runs)}


def test_parse_reference_reads_yaml_values():
    assert parse_reference(DEFAULT_REFERENCE) == {
        "model.norm": "rmsnorm",
        "model.mlp": "swiglu",
        "model.qk_norm": False,
    }
    with pytest.raises(RunsError, match="is not key=value"):
        parse_reference(["rmsnorm"])


def test_reference_shares_every_other_differing_key(tmp_path):
    found = variants(
        tmp_path,
        [
            dict(hidden_size=32),
            dict(hidden_size=64),
            dict(mlp="gelu", hidden_size=32),
            dict(mlp="gelu", hidden_size=64),
            dict(norm="layernorm", mlp="gelu", hidden_size=64),
        ],
    )
    refs = references_by_config(list(found.values()), parse_reference(DEFAULT_REFERENCE))
    label = lambda v: v.label if v else None
    assert {k: label(v) for k, v in refs.items()} == {
        "rmsnorm + swiglu, model.hidden_size=32": "rmsnorm + swiglu, model.hidden_size=32",  # itself
        "rmsnorm + swiglu, model.hidden_size=64": "rmsnorm + swiglu, model.hidden_size=64",
        "rmsnorm + gelu, model.hidden_size=32": "rmsnorm + swiglu, model.hidden_size=32",
        "rmsnorm + gelu, model.hidden_size=64": "rmsnorm + swiglu, model.hidden_size=64",
        "layernorm + gelu, model.hidden_size=64": "rmsnorm + swiglu, model.hidden_size=64",
    }


def test_a_reference_key_no_run_has_is_refused_naming_the_closest_and_missing_references_are_none(tmp_path):
    found = variants(tmp_path, [dict(hidden_size=32), dict(mlp="gelu", hidden_size=64)])
    with pytest.raises(
        RunsError, match=r"reference key model.nrom: no run's config.yaml has it \(did you mean model.norm\?\)"
    ):
        references_by_config(list(found.values()), parse_reference(["model.nrom=rmsnorm"]))
    refs = references_by_config(list(found.values()), parse_reference(DEFAULT_REFERENCE))
    assert refs["rmsnorm + swiglu, model.hidden_size=32"].label == "rmsnorm + swiglu, model.hidden_size=32"
    assert refs["rmsnorm + gelu, model.hidden_size=64"] is None  # no reference at its size
