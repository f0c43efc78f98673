"""lab/ablation/protocol.py: a cell's state from its run directory, the LR choice over states, moving aside."""

import yaml

from lab import sweep
from lab.ablation import protocol as C
from lab.ablation.protocol import Cell, Spec
from tests.run_helpers import write_run
from training.checkpoint import JOB_STATUS

CELL = Cell("small", "ref", 1e-3, 0)


def status(path, state, error="", types=()):
    path.mkdir(parents=True, exist_ok=True)
    (path / JOB_STATUS).write_text(yaml.safe_dump({"status": state, "error": error, "error_types": list(types)}))


def test_states_from_run_directories(tmp_path):
    runs = tmp_path / "runs"
    assert C.inspect(CELL, runs).state == sweep.MISSING
    write_run(runs, CELL.run_name, bpb=2.5)
    finished = C.inspect(CELL, runs)
    assert finished.state == sweep.FINISHED and finished.final_bpb == 2.5


def test_incomplete_runs_resume_from_a_checkpoint_or_restart(tmp_path):
    runs = tmp_path / "runs"
    path = write_run(runs, CELL.run_name, last_step=2)  # max_steps 4: stopped halfway
    assert C.inspect(CELL, runs).state == sweep.RESTART  # nothing to resume from
    (path / "checkpoints" / "step_0000002").mkdir(parents=True)
    state = C.inspect(CELL, runs)
    assert state.state == sweep.RESUMABLE and state.final_bpb is None


def test_a_failed_job_is_diverged_only_when_the_loss_went_non_finite(tmp_path):
    runs = tmp_path / "runs"
    path = write_run(runs, CELL.run_name, last_step=2)
    status(path, "FAILED", "non-finite loss or gradient at step 2 (update skipped)", ["JobFailed", "NonFiniteLoss"])
    diverged = C.inspect(CELL, runs)
    assert (
        diverged.state == sweep.DIVERGED and diverged.error.startswith("non-finite loss") and diverged.final_bpb is None
    )
    status(path, "FAILED", "cannot write metrics: disk full", ["JobFailed", "WriteError"])
    assert C.inspect(CELL, runs).state == sweep.FAILED
    status(path, "COMPLETED")
    assert C.inspect(CELL, runs).state == sweep.RESTART  # completed yet incomplete: e.g. killed after the status


def test_a_failed_status_outranks_complete_metrics(tmp_path):
    runs = tmp_path / "runs"
    path = write_run(runs, CELL.run_name)
    status(path, "FAILED", "checkpoint save failed", ["JobFailed", "OSError"])
    assert C.inspect(CELL, runs).state == sweep.FAILED


def test_chosen_lrs_waits_for_the_whole_sweep_and_skips_diverged(tmp_path):
    spec = Spec(
        variants={"ref": [], "gelu": [], "none": []},
        reference="ref",
        lr_grid=[1e-3, 1e-2, 3e-3],
        seeds=[1],
        sizes={"small": []},
        stage1_seed=0,
        lr_extensions=0,
    )
    runs = tmp_path / "runs"
    write_run(runs, Cell("small", "ref", 1e-3, 0).run_name, bpb=2.2)
    write_run(runs, Cell("small", "ref", 3e-3, 0).run_name, bpb=2.05)
    write_run(runs, Cell("small", "ref", 1e-2, 0).run_name, bpb=2.1)
    write_run(runs, Cell("small", "gelu", 1e-3, 0).run_name, bpb=2.3)  # its other runs have not finished
    for lr in (1e-3, 3e-3, 1e-2):
        status(runs / Cell("small", "none", lr, 0).run_name, "FAILED", "non-finite loss", ["NonFiniteLoss"])
    states = {c: C.inspect(c, runs) for lr in spec.lr_grid for c in (Cell("small", v, lr, 0) for v in spec.variants)}
    assert C.chosen_lrs(spec, states) == {"small": {"ref": 3e-3, "none": None}}


def test_an_edge_extends_the_sweep_and_the_choice_waits_for_it(tmp_path):
    """ref is best at the top of the grid: stage 1 grows by 2e-2, whose run decides the choice."""
    spec = Spec(
        variants={"ref": []}, reference="ref", lr_grid=[2.5e-3, 5e-3, 1e-2], seeds=[0], sizes={"s": []}, lr_extensions=1
    )
    runs = tmp_path / "runs"
    for lr, bpb in ((2.5e-3, 2.3), (5e-3, 2.2), (1e-2, 2.1)):
        write_run(runs, Cell("s", "ref", lr, 100).run_name, bpb=bpb)
    inspect = lambda cells: {c: C.inspect(c, runs) for c in cells}
    states = C.stage1_states(spec, inspect)
    extension = Cell("s", "ref", 2e-2, 100)
    assert states[extension].state == sweep.MISSING and len(states) == 4
    assert C.chosen_lrs(spec, states) == {"s": {}}  # not settled until the extension ran
    write_run(runs, extension.run_name, bpb=2.15)
    states = C.stage1_states(spec, inspect)
    assert len(states) == 4 and C.chosen_lrs(spec, states) == {"s": {"ref": 1e-2}}  # interior now: no more points


def test_move_aside_keeps_everything(tmp_path):
    runs, discarded = tmp_path / "runs", tmp_path / "discarded"
    for n in range(2):
        path = write_run(runs, CELL.run_name, last_step=2, bpb=float(n))
        moved = sweep.move_aside(path, discarded, CELL.run_name)
        assert not path.exists() and (moved / "metrics.jsonl").exists()
    kept = sorted(p.parent for p in discarded.rglob("metrics.jsonl"))
    assert len(kept) == 2  # the second move did not overwrite the first


def test_under_transfer_from_every_size_takes_the_transfer_sizes_choice(tmp_path):
    """Only w64 sweeps; w256 (and a variant that runs only at w64) take what w64 chose, once it is settled."""
    spec = Spec(
        variants={"ref": [], "gelu": [], "qk": []},
        reference="ref",
        lr_grid=[1e-3, 3e-3, 1e-2],
        seeds=[1],
        sizes={"w64": [], "w256": ["model.hidden_size=256"]},
        variant_sizes={"qk": ["w64"]},
        transfer_from="w64",
        stage1_seed=0,
        lr_extensions=0,
    )
    runs = tmp_path / "runs"
    for variant, bpbs in (("ref", (2.2, 2.05, 2.1)), ("gelu", (2.1, 2.2, 2.3)), ("qk", (2.3, 2.2, 2.25))):
        for lr, bpb in zip(spec.lr_grid, bpbs):
            write_run(runs, Cell("w64", variant, lr, 0).run_name, bpb=bpb)
    inspect = lambda cells: {c: C.inspect(c, runs) for c in cells}
    states = C.stage1_states(spec, inspect)
    assert {c.size for c in states} == {"w64"} and len(states) == 9  # no LR sweep at w256
    assert C.chosen_lrs(spec, states) == {
        "w64": {"ref": 3e-3, "gelu": 1e-3, "qk": 3e-3},
        "w256": {"ref": 3e-3, "gelu": 1e-3},
    }
    unsettled = {c: s for c, s in states.items() if c.variant != "gelu" or c.lr != 1e-2}
    assert C.chosen_lrs(spec, unsettled) == {"w64": {"ref": 3e-3, "qk": 3e-3}, "w256": {"ref": 3e-3}}  # gelu waits
