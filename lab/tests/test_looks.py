"""analysis/looks.py: no seed is added after a look unless a sequential design says so, and then every
look is judged at α / looks."""

import pytest

from lab.stats import LookError, alpha_for, check_added_seeds, record


def test_seeds_beyond_a_look_are_refused_without_a_sequential_design():
    looks = record([], {"muon": [0, 1], "base": [0, 1]}, sequential=False)
    check_added_seeds(looks, {"muon": [0, 1], "new_recipe": [0, 1, 2]}, False, "or use another --dir")  # fine
    with pytest.raises(LookError, match=r"muon: seeds 2 would be added after a look at seeds 0, 1 .*--sequential"):
        check_added_seeds(looks, {"muon": [0, 1, 2]}, False, "or use another --dir")
    check_added_seeds(looks, {"muon": [0, 1, 2]}, True, "")  # stated: allowed


def test_a_sequential_design_splits_alpha_over_its_looks():
    looks = record([], {"muon": [0, 1]}, sequential=False)
    assert alpha_for(0.05, looks, "muon") == (0.05, 1)  # one look: α itself
    assert record(looks, {"muon": [0, 1]}, False) == looks  # the same seeds judged again: not a new look
    looks = record(looks, {"muon": [0, 1, 2]}, sequential=True)
    assert alpha_for(0.05, looks, "muon") == (0.025, 2)  # campaign 1's third seed, judged at 0.025
    looks = record(looks, {"muon": [0, 1, 2, 3]}, sequential=True)
    assert alpha_for(0.05, looks, "muon") == pytest.approx((0.05 / 3, 3))
    assert alpha_for(0.05, looks, "base") == (0.05, 1)  # a group never looked at: α
