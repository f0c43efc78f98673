"""lab/ablation/lr_search.py: the LR choice, and a best LR at the grid's edge extending the grid, once
per round, until it is interior or the cap is reached; deterministic in the results, so a resume agrees."""

import pytest

from lab.ablation.lr_search import at_grid_edge, beyond, choose_lr, edge_note, margin, sweep

GRID = [5e-4, 1e-3, 2e-3, 4e-3, 8e-3]


def bowl(best: float):
    """Final bpb of a U-shaped LR curve with its minimum at `best` (log-symmetric)."""
    import math

    return lambda lr: 2.0 + 0.1 * math.log2(lr / best) ** 2


def run_to_settle(grid, curve, cap):
    """Play the protocol: run whatever is pending until the sweep settles; return it and the rounds."""
    results, rounds = {}, 0
    while True:
        s = sweep(grid, results, cap)
        if s.settled:
            return s, rounds
        results.update({lr: curve(lr) for lr in s.pending})
        rounds += 1


def test_an_interior_best_is_chosen_without_extension():
    s, rounds = run_to_settle(GRID, bowl(2e-3), cap=2)
    assert (s.best, s.extensions, s.capped, rounds) == (2e-3, 0, False, 1)
    assert edge_note(s, 2) == "interior"


def test_a_best_at_the_top_edge_adds_one_point_beyond_it_until_interior():
    s, rounds = run_to_settle(GRID, bowl(1.6e-2), cap=3)
    assert s.lrs == [*GRID, 1.6e-2, 3.2e-2] and s.best == 1.6e-2 and not s.capped
    assert rounds == 3  # the grid, then 1.6e-2 (still the edge), then 3.2e-2 (1.6e-2 now interior)
    assert edge_note(s, 3) == "interior after 2 extension(s)"


def test_a_best_at_the_bottom_edge_stops_at_the_cap_and_says_so():
    s, _ = run_to_settle(GRID, bowl(1e-5), cap=2)
    assert s.lrs == [1.25e-4, 2.5e-4, *GRID] and s.best == 1.25e-4 and s.capped
    assert edge_note(s, 2).startswith("⚠ still at the grid's edge after 2 extension(s) (cap 2)")
    s0, _ = run_to_settle(GRID, bowl(1e-5), cap=0)
    assert s0.lrs == GRID and s0.capped and s0.best == 5e-4


def test_divergence_bounds_the_grid_from_above():
    curve = lambda lr: None if lr >= 8e-3 else bowl(1e-2)(lr)  # best finite LR 4e-3, 8e-3 diverged
    s, _ = run_to_settle(GRID, curve, cap=2)
    assert s.best == 4e-3 and s.extensions == 0  # not an edge: the next LR up diverged


def test_diverging_everywhere_extends_downwards():
    s, _ = run_to_settle(GRID, lambda lr: None if lr > 3e-4 else 2.0 if lr > 2e-4 else 2.1, cap=2)
    assert s.lrs[:2] == [1.25e-4, 2.5e-4] and s.best == 2.5e-4 and not s.capped  # 2.5e-4 the edge, then interior
    s, _ = run_to_settle(GRID, lambda lr: None, cap=1)
    assert s.best is None and s.capped and edge_note(s, 1) == "diverged at every LR, down to 0.00025"


def test_the_next_point_names_the_same_directory_every_time():
    assert beyond([1e-3, 2e-3, 4e-3], upward=True) == 8e-3 and f"{beyond([1e-3, 2e-3], False):g}" == "0.0005"
    assert beyond([1e-3, 3e-3, 1e-2], upward=True) == pytest.approx(3.33333e-2)  # the edge's own spacing
    partial = {lr: bowl(1.6e-2)(lr) for lr in GRID}
    assert sweep(GRID, partial, 2) == sweep(list(reversed(GRID)), dict(partial), 2)  # order-free, deterministic
    assert sweep(GRID, partial, 2).pending == [1.6e-2]


def test_choose_lr_and_grid_edge():
    assert choose_lr({1e-3: 2.10, 3e-3: 2.05, 1e-2: 2.07}) == 3e-3
    assert choose_lr({1e-3: 2.10, 3e-3: None, 1e-2: float("nan")}) == 1e-3
    assert choose_lr({1e-3: 2.0, 3e-3: 2.0}) == 1e-3 and choose_lr({1e-3: None}) is None
    assert at_grid_edge(5e-4, GRID) and at_grid_edge(8e-3, GRID) and not at_grid_edge(2e-3, GRID)
    assert not at_grid_edge(1e-3, [1e-3])


def test_a_near_tie_within_the_stated_tolerance_goes_to_the_smaller_lr():
    results = {1e-3: 2.110, 2e-3: 2.104, 4e-3: 2.100, 8e-3: 2.180}
    assert choose_lr(results) == 4e-3  # no tolerance: the lowest bpb
    assert choose_lr(results, tolerance=0.005) == 2e-3  # 2.104 is within 0.005 of 2.100
    assert choose_lr(results, tolerance=0.01) == 1e-3
    assert choose_lr({1e-3: None, 2e-3: 2.2}, tolerance=1.0) == 2e-3  # a diverged LR never ties
    s = sweep([1e-3, 2e-3, 4e-3, 8e-3], {**results, 5e-4: 2.3}, cap=1, tolerance=0.005)
    assert s.best == 2e-3 and s.extensions == 0  # interior once the tie is resolved: no extension


def test_the_margin_is_the_runner_up_bpb_less_the_chosen_ones():
    results = {1e-3: 2.110, 2e-3: 2.104, 4e-3: 2.100, 8e-3: None}
    assert margin(results, 4e-3) == pytest.approx(0.004)
    assert margin(results, 2e-3) == pytest.approx(-0.004)  # a tie won by the smaller LR: below the best
    assert margin({1e-3: 2.0}, 1e-3) is None and margin(results, None) is None


def test_the_tolerance_is_a_stated_bpb_margin():
    from lab.ablation.protocol import ProtocolError, Spec

    spec = dict(reference="a", variants={"a": [], "b": []}, lr_grid=[1e-3, 2e-3], seeds=[0])
    assert Spec(**spec).lr_tie_tolerance == 0.0  # unstated: the lowest bpb alone, as protocols before it chose
    with pytest.raises(ProtocolError, match=r"lr_tie_tolerance=-0.01 must be a bpb margin in \[0, 1\)"):
        Spec(**spec, lr_tie_tolerance=-0.01)


def test_the_protocol_s_sweep_applies_the_spec_s_tolerance():
    """The rule reaches the choice the protocol makes (lr_sweep, which stage 2 and the report read), not only
    choose_lr: 2e-3 is within 0.01 bpb of the best, 4e-3."""
    from lab.ablation.protocol import Cell, Spec, lr_sweep

    base = dict(reference="a", variants={"a": []}, lr_grid=[1e-3, 2e-3, 4e-3, 8e-3], seeds=[0], lr_extensions=0)
    done = {Cell("base", "a", lr, 100): bpb for lr, bpb in {1e-3: 2.2, 2e-3: 2.105, 4e-3: 2.1, 8e-3: 2.3}.items()}
    assert lr_sweep(Spec(**base), "base", "a", done).best == 4e-3
    assert lr_sweep(Spec(**base, lr_tie_tolerance=0.01), "base", "a", done).best == 2e-3
