"""training/cli.py apply_length_rule and what the run makes of it: the run ends at the first reached of
trainer.max_steps, max_epochs and time_budget; the command line wins over the config files and says what it turned
off; a typed step count with another length is refused in one line; the header names what decides."""

import pytest

from training.cli import ConfigError
from training.program import compose_run_config


def length(*overrides):
    t = compose_run_config(list(overrides)).trainer
    return t.max_steps, t.max_epochs, t.time_budget


def test_the_default_is_ten_minutes_or_four_passes_whichever_comes_first():
    # A test that fails if the default reverts to spending its budget on a corpus it has used up.
    assert length() == (None, 4.0, 10.0)


@pytest.mark.parametrize(
    "overrides, expected, said",
    [
        (
            ["trainer.max_steps=160"],
            (160, None, None),
            "length: trainer.max_steps=160 from the command line decides it; trainer.max_epochs=4 and "
            "trainer.time_budget=10 from the config are off",
        ),
        (
            ["trainer.max_epochs=2"],
            (None, 2.0, None),
            "length: trainer.max_epochs=2 from the command line decides it; trainer.time_budget=10 from the config is off",
        ),
        (
            ["trainer=gpu", "trainer.time_budget=2"],
            (None, None, 2.0),
            "length: trainer.time_budget=2 from the command line decides it; trainer.max_steps=5000 from the config is off",
        ),
    ],
)
def test_a_length_typed_on_the_command_line_wins_and_says_what_it_turned_off(capsys, overrides, expected, said):
    assert length(*overrides) == expected
    assert said in capsys.readouterr().out


def test_a_typed_time_budget_keeps_the_configs_passes_and_nothing_is_said(capsys):
    assert length("trainer.time_budget=3") == (None, 4.0, 3.0)  # 3 minutes or 4 passes, whichever comes first
    assert length("trainer.time_budget=3", "trainer.max_epochs=8") == (None, 8.0, 3.0)  # both typed: both hold
    assert length("trainer.time_budget=null", "trainer.max_epochs=null", "trainer.max_steps=20") == (20, None, None)
    assert length("trainer.time_budget=null") == (None, 4.0, None)  # the passes alone
    assert "length:" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "overrides", [["trainer.max_steps=160", "trainer.time_budget=5"], ["trainer.max_epochs=2", "trainer.max_steps=10"]]
)
def test_a_typed_step_count_with_another_length_is_refused_in_one_line(overrides):
    with pytest.raises(ConfigError) as e:
        compose_run_config(overrides)
    assert "both set the run's length, and a step count is exact; keep one" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_run_with_no_length_at_all_is_refused_in_one_line():
    with pytest.raises(ValueError, match="all null: the run has no end; set one of them"):
        compose_run_config(["trainer.time_budget=null", "trainer.max_epochs=null"])


@pytest.mark.parametrize(
    "max_steps, every",
    [(7, 1), (10, 1), (19, 1), (20, 2), (289, 20), (700, 50), (1490, 100), (2000, 200), (3292, 200), (10**9, 10**8)],
)
def test_evaluations_are_sized_to_the_run_at_least_ten_of_them(max_steps, every):
    trainer = compose_run_config([]).trainer
    assert trainer.eval_interval is None and trainer.eval_every(max_steps) == every
    assert max_steps // every >= min(10, max_steps) and max_steps // every < 26
    assert compose_run_config(["trainer.eval_interval=40"]).trainer.eval_every(max_steps) == 40
