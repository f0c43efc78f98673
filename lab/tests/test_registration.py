"""lab/ablation/registration.py: the pre-registration's SHA-256, recorded before the first cell trains;
amendments made through ablate.py recorded beside it; a spec or a record edited by hand refused in one line."""

import dataclasses
import re
import subprocess

import pytest

from lab.ablation import registration as R
from lab.ablation.configs import config_digest
from lab.ablation.protocol import ProtocolError, Spec
from training.program import compose_train_config

SPEC = dict(
    reference="ref",
    variants={"ref": [], "gelu": ["model.mlp=gelu"]},
    lr_grid=[1e-3, 1e-2],
    seeds=[0, 1],
    primary=["gelu"],
)
CONFIGS = {"base/ref": "a" * 64, "base/gelu": "b" * 64}


def test_a_new_protocol_is_registered_once_with_its_hash_time_and_command():
    manifest, spec = {}, Spec(**SPEC)
    record = R.register(manifest, spec, "ablate.py --dir p", CONFIGS)
    assert record["sha256"] == R.fingerprint(R.preregistered(spec, CONFIGS)) and len(record["sha256"]) == 64
    assert record["command"] == "ablate.py --dir p" and record["preregistered"]["alpha"] == 0.05
    assert R.register(manifest, Spec(**SPEC), "ablate.py --dir p", CONFIGS) is None  # the same spec: nothing new
    assert R.check(manifest, spec, "p") == f"Pre-registered {record['registered']}, SHA-256 {record['sha256']}."


def test_what_only_plans_is_not_registered():
    """planning_sd and the stored throughput only estimate power and cost: changing them changes no verdict."""
    spec = Spec(**SPEC)
    planned = dataclasses.replace(spec, planning_sd=0.03, planning_tokens_per_s={"base": 1000.0})
    assert R.fingerprint(R.preregistered(planned)) == R.fingerprint(R.preregistered(spec))


def test_an_amendment_through_ablate_is_recorded_and_named():
    manifest = {}
    R.register(manifest, Spec(**SPEC), "first", CONFIGS)
    grown = Spec(**{**SPEC, "variants": {**SPEC["variants"], "relu2": ["model.mlp=relu2"]}})
    record = R.register(manifest, grown, "second", CONFIGS)
    assert record["amends"] == ["secondary", "variants"]  # relu2 joins the secondary family
    line = R.check(manifest, grown, "p")
    assert (
        line.startswith(f"Pre-registered {manifest['registrations'][0]['registered']}")
        and f"; amended {record['registered']} (secondary, variants: {record['sha256'][:12]})" in line
    )


@pytest.mark.parametrize(
    "field, value",
    [("alpha", 0.1), ("equivalence_margin", 0.05), ("seeds", [0, 1, 2]), ("primary", []), ("lr_grid", [1e-3])],
)
def test_a_spec_edited_by_hand_is_refused_in_one_line(field, value):
    manifest = {}
    R.register(manifest, Spec(**SPEC), "first", CONFIGS)
    edited = Spec(**{**SPEC, field: value, **({"secondary": ["gelu"]} if field == "primary" else {})})
    with pytest.raises(
        ProtocolError,
        match=rf"^p: the spec's .*{field}.* no longer match\(es\) its pre-registration "
        r"[0-9a-f]{12} of .*: it was edited outside ablate.py; restore it, or start",
    ):
        R.check(manifest, edited, "p")


def test_a_record_edited_by_hand_no_longer_hashes_to_itself():
    manifest = {}
    R.register(manifest, Spec(**SPEC), "first", CONFIGS)
    manifest["registrations"][0]["preregistered"]["alpha"] = 0.1  # the record moved along with the spec
    with pytest.raises(ProtocolError, match=r"no longer hashes to its recorded [0-9a-f]{12}: the manifest was edited"):
        R.check(manifest, Spec(**{**SPEC, "alpha": 0.1}), "p")


def test_every_cells_composed_config_the_analysis_code_and_the_commit_are_registered():
    manifest = {}
    record = R.register(manifest, Spec(**SPEC), "first", CONFIGS)
    assert record["preregistered"]["configs"] == CONFIGS and record["preregistered"]["analysis"] == R.analysis_digest()
    assert re.fullmatch(r"[0-9a-f]{40}( dirty)?", record["commit"]), record["commit"]
    assert record["sha256"] != R.fingerprint(R.preregistered(Spec(**SPEC)))  # the configs are in the hash
    R.check_configs(manifest, {**CONFIGS, "base/relu2": "c" * 64}, "p")  # a new cell: an amendment's to record
    with pytest.raises(ProtocolError, match=r"^p: the composed config of base/gelu \(its preset or a config group"):
        R.check_configs(manifest, {**CONFIGS, "base/gelu": "d" * 64}, "p")  # a preset edited since
    manifest["registrations"][0]["preregistered"]["analysis"] = "0" * 64  # judged by other code than this
    with pytest.raises(ProtocolError, match=r"judged by analysis code 000000000000, but this code's is [0-9a-f]{12}"):
        R.check_configs(manifest, CONFIGS, "p")


def test_the_analysis_digest_covers_each_analysis_file(monkeypatch, tmp_path):
    assert all((R.REPO / name).is_file() for name in R.ANALYSIS_CODE)  # none renamed or gone
    for name in R.ANALYSIS_CODE:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    monkeypatch.setattr(R, "REPO", tmp_path)
    before = R.analysis_digest()
    (tmp_path / R.ANALYSIS_CODE[-1]).write_text("x = 2\n")
    assert R.analysis_digest() != before


def test_the_commit_says_dirty_when_a_tracked_file_differs(monkeypatch, tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    monkeypatch.setattr(R, "REPO", tmp_path)
    clean = R.git_commit()
    assert re.fullmatch(r"[0-9a-f]{40}", clean)
    (tmp_path / "untracked.txt").write_text("a run's output\n")
    assert R.git_commit() == clean  # only tracked files make the tree dirty
    (tmp_path / "a.py").write_text("2\n")
    assert R.git_commit() == f"{clean} dirty"
    monkeypatch.setattr(R, "REPO", tmp_path / "nowhere")
    assert R.git_commit().startswith("unknown")


def test_a_config_digest_is_what_a_run_computes_not_where_it_is_written():
    base = ["debug=tiny", "data.vocab_size=320"]
    digest = config_digest(compose_train_config(base)[0])
    moved = compose_train_config([*base, "outputs_dir=/elsewhere", "data.cache_dir=/x", "run_name=r"])[0]
    assert config_digest(moved) == digest
    assert config_digest(compose_train_config([*base, "trainer.eval_windows=4"])[0]) != digest  # a preset's value
