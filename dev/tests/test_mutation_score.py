"""dev/mutation_score.py: the score per target from mutmut's result files, equivalent mutants
excluded only while they are listed with a reason and still survive."""

import json

from dev.mutation_score import TARGETS, main

DOC = """# Testing

## Surviving mutants judged equivalent

| mutant | why it is equivalent |
|---|---|
| `model.norm.xǁRMSNormǁforward__mutmut_3` | an equivalent rewrite |

## Next section
| `model.norm.xǁRMSNormǁforward__mutmut_9` | not in the table above: does not count |
"""


def write_results(root, path, codes):
    meta = root / (path + ".meta")
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(
        json.dumps(
            {
                "exit_code_by_key": codes,
                "hash_by_function_name": {},
                "type_check_error_by_key": {},
                "durations_by_key": {},
                "estimated_durations_by_key": {},
            }
        )
    )


def norm_mutants(survivors, killed=18):
    codes = {f"model.norm.xǁRMSNormǁforward__mutmut_{i}": 1 for i in range(100, 100 + killed)}
    codes.update({f"model.norm.xǁRMSNormǁforward__mutmut_{i}": 0 for i in survivors})
    return codes


def all_targets_killed(root):
    """Every target of pyproject.toml's only_mutate but model/* has a killed mutant and a timed-out one."""
    for i, target in enumerate(t for t in TARGETS if t != "model/*"):
        codes = {f"m{i}.x_f__mutmut_1": 1, f"m{i}.x_f__mutmut_2": 24}  # a timeout counts as killed
        write_results(root, target.replace("*", "x.py"), codes)
    write_results(root, "training/cli.py", {"training.cli.x_run__mutmut_1": 0})  # not a target: ignored


def test_equivalent_mutants_leave_the_denominator(tmp_path, capsys):
    (tmp_path / "testing.md").write_text(DOC)
    write_results(tmp_path / "mutants", "model/norm.py", norm_mutants([3, 9]))  # 18 killed, 9 survives
    all_targets_killed(tmp_path / "mutants")
    status = main(["--dir", str(tmp_path / "mutants"), "--doc", str(tmp_path / "testing.md"), "--survivors"])
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if row.startswith("model/* "))
    assert line.split() == ["model/*", "20", "18", "1", "1", "0", "0", "94.7%"]  # 18 / (20 − 1)
    assert "model.norm.xǁRMSNormǁforward__mutmut_9" in out.split("surviving")[1]
    assert status == 0


def test_below_90_percent_or_a_stale_equivalence_fails(tmp_path, capsys):
    (tmp_path / "testing.md").write_text(DOC)
    all_targets_killed(tmp_path / "mutants")
    write_results(tmp_path / "mutants", "model/norm.py", norm_mutants([3, 9, 10], killed=17))
    assert main(["--dir", str(tmp_path / "mutants"), "--doc", str(tmp_path / "testing.md")]) == 1  # 17/19 = 89.5 %
    assert "below 90%" in capsys.readouterr().err
    write_results(tmp_path / "mutants", "model/norm.py", norm_mutants([], killed=20))  # _3 no longer survives
    assert main(["--dir", str(tmp_path / "mutants"), "--doc", str(tmp_path / "testing.md")]) == 1
    assert "forward__mutmut_3" in capsys.readouterr().err


def test_todo_is_what_a_glob_has_left_to_run_and_a_plain_name_stands(tmp_path, capsys):
    """mutmut reruns every mutant a glob matches; dev/mutation.sh runs only what --todo prints: the
    matching mutants with no result or an unexplained survival. A plain name is passed through (a rerun)."""
    (tmp_path / "testing.md").write_text(DOC)
    codes = {
        "model.norm.xǁRMSNormǁforward__mutmut_1": 1,
        "model.norm.xǁRMSNormǁforward__mutmut_2": None,
        "model.norm.xǁRMSNormǁforward__mutmut_3": 0,
        "model.norm.xǁRMSNormǁforward__mutmut_4": 0,
        "model.norm.xǁRMSNormǁforward__mutmut_5": 24,
    }
    write_results(tmp_path / "mutants", "model/norm.py", codes)
    write_results(tmp_path / "mutants", "model/rope.py", {"model.rope.x_rope_tables__mutmut_1": None})

    def todo(*patterns):
        assert (
            main(["--dir", str(tmp_path / "mutants"), "--doc", str(tmp_path / "testing.md"), "--todo", *patterns]) == 0
        )
        return capsys.readouterr().out.split()

    # 2 has not run, 4 survived unexplained; 3 is listed as equivalent, 1 and 5 are killed.
    assert todo("model.norm.*") == ["model.norm.xǁRMSNormǁforward__mutmut_2", "model.norm.xǁRMSNormǁforward__mutmut_4"]
    assert todo("model.*") == [
        "model.norm.xǁRMSNormǁforward__mutmut_2",
        "model.norm.xǁRMSNormǁforward__mutmut_4",
        "model.rope.x_rope_tables__mutmut_1",
    ]
    assert todo("model.norm.xǁRMSNormǁforward__mutmut_1") == ["model.norm.xǁRMSNormǁforward__mutmut_1"]
    assert todo("data.*") == []
    assert main(["--dir", str(tmp_path / "empty"), "--doc", str(tmp_path / "testing.md"), "--todo", "model.*"]) == 0
    assert capsys.readouterr().out.split() == ["model.*"]  # nothing has run yet: mutmut expands it
