"""Validation hold-out rules: whole files by bytes (several text files), documents by a seeded hash."""

import random

import numpy as np
import pytest

from data.sources import describe_held_files, hold_out_files, uniform_hash


def make_files(folder, sizes, prefix="f"):
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, size in enumerate(sizes):
        path = folder / f"{prefix}{i:03d}.txt"
        path.write_bytes(b"x" * size)
        files.append(path)
    return files


def share(held, files):
    return sum(f.stat().st_size for f in held) / sum(f.stat().st_size for f in files)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_files_held_out_come_close_to_the_fraction(tmp_path, seed):
    rng = random.Random(seed)
    files = make_files(tmp_path, [rng.randint(1_000, 5_000) for _ in range(60)])
    held = hold_out_files(files, 0.1, seed)
    biggest = max(f.stat().st_size for f in files) / sum(f.stat().st_size for f in files)
    # Greedy "closer to the target": it stops within half a file of 10% (or it would have added one more).
    assert abs(share(held, files) - 0.1) <= biggest / 2 + 1e-9
    assert hold_out_files(files, 0.1, seed) == held  # deterministic
    assert set(hold_out_files(list(reversed(files)), 0.1, seed)) == set(held)  # whatever the listing order


def test_seed_changes_the_choice_and_names_not_places_decide(tmp_path):
    files = make_files(tmp_path / "a", [1000] * 40)
    choices = {tuple(f.name for f in hold_out_files(files, 0.1, seed)) for seed in range(5)}
    assert len(choices) > 1  # the seed matters
    moved = make_files(tmp_path / "elsewhere" / "b", [1000] * 40)  # same names, another folder
    assert [f.name for f in hold_out_files(moved, 0.1, 3)] == [f.name for f in hold_out_files(files, 0.1, 3)]


def test_at_least_one_file_never_all(tmp_path):
    two = make_files(tmp_path / "two", [100, 9_000])
    assert hold_out_files(two, 0.01, 0) == [two[0]]  # both overshoot 1%: the smallest one
    assert len(hold_out_files(two, 0.9, 0)) == 1  # train keeps a file whatever the fraction
    many = make_files(tmp_path / "many", [1000] * 5)
    assert 1 <= len(hold_out_files(many, 0.95, 0)) == 4


def test_description_names_the_files_and_their_share(tmp_path):
    files = make_files(tmp_path, [1000] * 20)
    held = hold_out_files(files, 0.1, 0)
    text = describe_held_files(held, files, 0.1)
    assert text.startswith(f"{len(held)} of 20 files held out whole ({share(held, files):.1%} of the bytes): ")
    assert all(f.name in text for f in held) and "val_fraction" not in text
    lots = describe_held_files(files[:8], files, 0.1)  # 40%: far above 10%, and says why and what to do
    assert "and 3 more (listed in meta.json)" in lots and files[5].name not in lots
    assert "more than data.val_fraction=0.1 because whole files are held out" in lots


def test_uniform_hash_is_uniform_and_seeded():
    values = uniform_hash(7, np.arange(100_000))
    assert values.min() >= 0 and values.max() < 1 and abs(values.mean() - 0.5) < 0.01
    assert abs((values < 0.05).mean() - 0.05) < 0.005
    assert np.array_equal(values, uniform_hash(7, np.arange(100_000)))
    assert not np.array_equal(values, uniform_hash(8, np.arange(100_000)))
