"""cli/config.py apply_length_rule: one rule for the settings that decide a run's length — the command line wins over the config
files and says what it turned off; two on the command line are refused in one line; the header names the one
that decides."""
import pytest

from cli.config import ConfigError, compose_run_config


def length(*overrides):
    t = compose_run_config(list(overrides)).trainer
    return t.max_steps, t.max_epochs, t.time_budget


def test_the_default_is_the_time_budget():
    assert length() == (1000, None, 10.0)


@pytest.mark.parametrize("overrides, expected, said", [
    (["trainer.max_steps=160"], (160, None, None),
     "length: trainer.max_steps=160 from the command line decides it; trainer.time_budget=10 from the config is off"),
    (["trainer.max_epochs=2"], (1000, 2.0, None),
     "length: trainer.max_epochs=2 from the command line decides it; trainer.time_budget=10 from the config is off"),
    (["experiment=small_corpus", "trainer.max_steps=30"], (30, None, None),
     "length: trainer.max_steps=30 from the command line decides it; trainer.max_epochs=4 from the config is off"),
    (["experiment=small_corpus", "trainer.time_budget=2"], (1000, None, 2.0),
     "length: trainer.time_budget=2 from the command line decides it; trainer.max_epochs=4 from the config is off"),
])
def test_a_length_typed_on_the_command_line_wins_and_says_what_it_turned_off(capsys, overrides, expected, said):
    assert length(*overrides) == expected
    assert said in capsys.readouterr().out


def test_nothing_is_said_when_nothing_is_turned_off(capsys):
    assert length("trainer.time_budget=null", "trainer.max_steps=20") == (20, None, None)
    assert length("trainer.time_budget=3") == (1000, None, 3.0)
    assert "length:" not in capsys.readouterr().out


@pytest.mark.parametrize("overrides", [["trainer.max_steps=160", "trainer.time_budget=5"],
                                       ["trainer.max_epochs=2", "trainer.max_steps=10"]])
def test_two_lengths_on_the_command_line_are_refused_in_one_line(overrides):
    with pytest.raises(ConfigError) as e:
        compose_run_config(overrides)
    assert "both set the run's length; keep one" in str(e.value) and "\n" not in str(e.value)
