"""The benchmarks (dev/bench/) run end to end at tiny sizes and report what they claim."""

import json
import re

import pytest

from dev.bench import model as bench_model
from tests import forked

pytestmark = pytest.mark.serial  # trains: one at a time under make test's two workers (tests/fixtures.py)

TINY = ["--shape", "tiny", "--steps", "2", "--warmup", "1", "--batch", "2"]


def test_bench_model_reports_both_models_at_the_same_shape(capsys):
    pytest.importorskip("transformers")
    bench_model.main(TINY)
    out = capsys.readouterr().out
    assert "shape tiny: hidden 64, 2 layers, 4 heads (2 kv) of 16" in out and "fp32" in out
    rows = {
        m.group(1): float(m.group(2).replace(",", ""))
        for m in re.finditer(r"^\| (minillama eager|hf_llama eager) \| \d+ \| [\d–]+ \| ([\d,]+) \|", out, re.M)
    }
    assert set(rows) == {"minillama eager", "hf_llama eager"} and all(v > 0 for v in rows.values())
    ratio = float(re.search(r"minillama / HF, eager: (\d+\.\d+)", out).group(1))
    assert ratio == pytest.approx(rows["minillama eager"] / rows["hf_llama eager"], rel=0.02)


def test_bench_model_times_muon_beside_adamw_with_the_optimizers_train_py_builds(capsys, monkeypatch):
    built = []
    real = bench_model.build_optimizers
    monkeypatch.setattr(bench_model, "build_optimizers", lambda *a: built.append(real(*a)) or built[-1])
    bench_model.main([*TINY, "--optim", "adamw,muon", "--no-hf"])
    out = capsys.readouterr().out
    assert [[type(o).__name__ for o in opts] for opts in built] == [["AdamW"], ["Muon", "AdamW"]]
    rows = re.findall(r"^\| (minillama eager \w+) \| \d+ \|", out, re.M)
    assert rows == ["minillama eager adamw", "minillama eager muon"]
    ratio = float(re.search(r"step time muon / adamw: (\d+\.\d+)", out).group(1))
    assert ratio > 0


def test_bench_model_times_each_depth_side_by_side_against_the_first(capsys, monkeypatch):
    """--layers 2,1: our model at both depths, each with both optimizers, every ratio to the first depth
    (the step cost the speedrun's layers recipes need, measured where drift hits both alike)."""
    built = []
    real = bench_model.build_optimizers
    monkeypatch.setattr(
        bench_model, "build_optimizers", lambda module, *a: built.append(len(module.model.layers)) or real(module, *a)
    )
    bench_model.main([*TINY, "--optim", "adamw,muon", "--no-hf", "--layers", "2,1"])
    out = capsys.readouterr().out
    assert built == [2, 1, 2, 1]  # adamw at depths 2 and 1, then muon at both
    assert re.findall(r"^\| (minillama L\d eager \w+) \| \d+ \|", out, re.M) == [
        "minillama L2 eager adamw",
        "minillama L1 eager adamw",
        "minillama L2 eager muon",
        "minillama L1 eager muon",
    ]
    tps = {
        m.group(1): float(m.group(2).replace(",", ""))
        for m in re.finditer(r"^\| (minillama L\d eager \w+) \| \d+ \| [\d–]+ \| ([\d,]+) \|", out, re.M)
    }
    for optim in ("adamw", "muon"):  # the printed ratio is the table's: step time at depth 1 / at depth 2
        ratio = float(re.search(rf"minillama eager {optim}, step time L1 / L2: (\d+\.\d+)", out).group(1))
        assert ratio == pytest.approx(tps[f"minillama L2 eager {optim}"] / tps[f"minillama L1 eager {optim}"], rel=0.02)
    for depth in ("L2", "L1"):
        assert re.search(rf"minillama {depth} eager, step time muon / adamw: \d+\.\d+", out)
    assert "2,1 layers" in out


def test_bench_model_counts_each_depths_own_flops(capsys):
    """The table's TFLOP/s: tokens/s times the FLOPs per token of the variant's own depth, not the first's."""
    cfg = bench_model.model_config("tiny")
    times = {("minillama", 2, "eager", "adamw"): [2.0], ("minillama", 1, "eager", "adamw"): [1.0]}
    bench_model.report(cfg, [2, 1], ["adamw"], times, 10**6, "fp32", 1e12)
    out = capsys.readouterr().out
    for depth, seconds in ((2, 2.0), (1, 1.0)):
        flops = bench_model._meta_model(bench_model.replace(cfg, n_layers=depth)).flops_per_token(cfg.max_seq_len)
        row = next(line for line in out.splitlines() if line.startswith(f"| minillama L{depth} eager |"))
        assert row.split("|")[5].strip() == f"{10**6 / seconds * flops / 1e12:.3f}"
    assert "minillama eager, step time L1 / L2: 0.500" in out


def test_bench_model_rejects_bad_depths_and_optimizers():
    out = forked.run_script("-m", "dev.bench", "model", "--layers", "6,0", "--no-hf")
    assert out.returncode == 1 and out.stderr.startswith("error: --layers 6,0: give distinct depths >= 1")
    out = forked.run_script("-m", "dev.bench", "model", "--optim", "adamw,sgd", "--no-hf")
    assert out.returncode == 1 and out.stderr.startswith("error: --optim adamw,sgd: give distinct optimizers")


def test_bench_model_rejects_an_unknown_shape():
    out = forked.run_script("-m", "dev.bench", "model", "--shape", "huge", "--no-hf")
    assert out.returncode == 1 and out.stderr.startswith("error: --shape huge: no configs/model/huge.yaml")


def test_an_unknown_benchmark_is_one_error_line_naming_the_benchmarks():
    out = forked.run_script("-m", "dev.bench", "modle")
    assert out.returncode == 1 and out.stderr.startswith("error: 'modle' is no benchmark;")
    assert "model, data, generate" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_help_names_the_benchmarks_and_exits_0():
    out = forked.run_script("-m", "dev.bench", "--help")
    assert out.returncode == 0 and "NAME one of the modules below" in out.stdout and "newton_schulz" in out.stdout


def test_bench_checkpoint_reports_save_and_verify_costs(capsys):
    from dev.bench import checkpoint as bench_checkpoint

    bench_checkpoint.main(["--models", "tiny"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].endswith(" MB") and float(cells[2].split()[0]) > 0
    assert all(c.endswith(" s") and float(c.split()[0]) >= 0 for c in cells[3:6])


def test_bench_data_runs_the_command_and_the_samples(tmp_path, capsys, monkeypatch):
    """The data benchmark at 0.3 MB: the corpus it builds, the command's row (two cold runs, the faster, a hit) and
    the samples' rows, the largest sample the reference. Its five commands forked (tests/forked.py): ~8 s cheaper."""
    from dev.bench import data as bench_data

    real_popen = bench_data.subprocess.Popen
    monkeypatch.setattr(bench_data.subprocess, "Popen", forked.popen_forking_train_py(real_popen, ("prepare_data.py",)))

    corpus = bench_data.python_corpus(tmp_path / "c", 0.3)
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert sum(len(r["text"].encode()) for r in rows) >= 0.3e6 and all(set(r) == {"text"} for r in rows)
    bench_data.main(["--corpus-mb", "0.3", "--corpus-dir", str(tmp_path)])
    bench_data.main(["--corpus-mb", "0.3", "--corpus-dir", str(tmp_path), "--samples", "0.1,0.3"])
    out = capsys.readouterr().out
    command = re.search(r"^\| `\w+` \| ([\d.]+) / ([\d.]+) s \| \*\*([\d.]+) s\*\* \|", out, re.M)
    assert command and float(command[3]) == min(float(command[1]), float(command[2]))
    sample_rows = re.findall(r"^\| ([\d.]+) MB \| ([\d.]+) \| ([+-][\d.]+) % \|", out, re.M)
    assert [r[0] for r in sample_rows] == ["0.1", "0.3"] and float(sample_rows[1][2]) == 0


def test_bench_newton_schulz_compares_bf16_with_fp32_at_the_runs_shapes(capsys):
    from dev.bench import newton_schulz

    newton_schulz.main(["model=tiny"])
    out = capsys.readouterr().out
    rows = re.findall(
        r"^\| (\d+) × (\d+) \| (\d+) \| [\d.]+ \| [\d.]+ \| [\d.]+× \| ([\d.]+) \| ([\d.]+)–([\d.]+) "
        r"\| ([\d.]+)–([\d.]+) \|$",
        out,
        re.M,
    )
    assert rows and "**all**" in out
    for rows_, cols, count, diff, lo32, hi32, lo16, hi16 in rows:
        assert int(count) > 1  # the tiny model's layers: several matrices of each shape
        assert float(diff) < 0.05  # bf16 rounding, not another answer
        # bf16 keeps fp32's band (5 steps do not lift a random square matrix's smallest singular values in either)
        assert abs(float(lo16) - float(lo32)) < 0.05 and abs(float(hi16) - float(hi32)) < 0.05 and float(hi16) < 1.5


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_peak_is_looked_up_or_measured_and_the_table_is_plausible():
    import torch

    from dev.bench import measure_matmul_flops
    from training.log import gpu_peak, peak_flops

    name = torch.cuda.get_device_name(torch.device("cuda", 0))
    flops, source = peak_flops(torch.device("cuda", 0), "bf16")
    measured = measure_matmul_flops(torch.device("cuda", 0), torch.bfloat16, n=8192)
    print(f"{name}: peak_flops -> {flops / 1e12:.0f} TFLOP/s ({source}); measured bf16 {measured / 1e12:.0f}")
    if gpu_peak(name) is not None:
        # A measured matmul reaches 60-95 % of a correct data-sheet number; far off means a wrong row.
        assert 0.4 < measured / flops < 1.05, (name, measured, flops)
    else:
        assert source.startswith("one quick bf16 matmul probe on "), source  # a GPU off the table: measured


def test_bench_generate_times_each_method_and_checks_they_generate_the_same_tokens():
    pytest.importorskip("transformers")
    import torch

    from dev.bench import generate as bench_generate
    from model import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=512, hidden_size=64, n_layers=2, n_heads=4, max_seq_len=64)).eval()
    report = bench_generate.measure(model, 8, repeats=1)
    rows = [line.split("|")[1:-1] for line in report.splitlines() if line.startswith("| minillama") or "HF" in line]
    assert [r[0].strip() for r in rows] == [
        "minillama + KV cache",
        "minillama, no cache (recompute)",
        "HF generate (exported copy)",
    ]
    assert all(float(r[1]) > 0 and r[3].strip() == "yes" for r in rows) and rows[0][2].strip() == "1.00×"


def test_bench_train_overhead_compares_the_loop_with_the_bare_step(capsys, tiny_data_cache):
    from dev.bench import train_overhead

    train_overhead.main(["--steps", "20", "debug=tiny", f"data.cache_dir={tiny_data_cache}"])
    row = capsys.readouterr().out.strip().splitlines()[-1]
    before, after, loop, overhead = (float(v.replace(",", "")) for v in re.findall(r"[-+]?[\d,]+\.?\d*", row))
    assert min(before, after, loop) > 0
    assert overhead == pytest.approx(100 * ((before + after) / 2 / loop - 1), abs=0.06)
