"""The benchmarks (devtools/bench/) run end to end at tiny sizes and report what they claim (bench_model,
bench_loss, …)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from devtools.bench import loss as bench_loss
from devtools.bench import model as bench_model
from tests import forked

pytestmark = pytest.mark.serial  # trains: one at a time under make test's two workers (conftest.py)

REPO = Path(__file__).resolve().parents[1]


def forked_run(command, check=False, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of `python <script> …` as a real process forked from the preloaded server (tests/forked.py)."""
    assert command[0] == sys.executable
    done = forked.run_script(*command[1:])
    if check:
        done.check_returncode()
    return done


def test_bench_model_reports_both_models_at_the_same_shape(capsys):
    pytest.importorskip("transformers")
    bench_model.main(
        [
            "--shape",
            "tiny",
            "--vocab",
            "512",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--batch",
            "2",
            "--threads",
            "1",
            "--matmul-shapes",
        ]
    )
    out = capsys.readouterr().out
    assert "shape tiny: hidden 64, 2 layers, 4 heads (2 kv) of 16" in out and "fp32" in out
    rows = {
        m.group(1): float(m.group(2).replace(",", ""))
        for m in re.finditer(r"^\| (minillama eager|hf_llama eager) \| \d+ \| [\d–]+ \| ([\d,]+) \|", out, re.M)
    }
    assert set(rows) == {"minillama eager", "hf_llama eager"} and all(v > 0 for v in rows.values())
    assert "minillama / HF, eager:" in out and "128 tokens" in out  # the matmul-shape table, 2 × 64 tokens


def test_bench_model_times_muon_beside_adamw_with_the_optimizers_train_py_builds(capsys, monkeypatch):
    built = []
    real = bench_model.build_optimizers
    monkeypatch.setattr(bench_model, "build_optimizers", lambda *a: built.append(real(*a)) or built[-1])
    bench_model.main(
        [
            "--shape",
            "tiny",
            "--vocab",
            "512",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--batch",
            "2",
            "--threads",
            "1",
            "--optim",
            "adamw,muon",
            "--no-hf",
        ]
    )
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
    bench_model.main(
        [
            "--shape",
            "tiny",
            "--vocab",
            "512",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--batch",
            "2",
            "--threads",
            "1",
            "--optim",
            "adamw,muon",
            "--no-hf",
            "--layers",
            "2,1",
        ]
    )
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
    tiny = bench_model.model_config("tiny", 512, None, None)  # each depth's TFLOP/s from its own FLOPs per token
    assert (
        bench_model.variant_flops(tiny, "minillama L1 eager muon")
        == bench_model._meta_model(bench_model.replace(tiny, n_layers=1)).flops_per_token(64)
        < bench_model.variant_flops(tiny, "minillama eager")
    )
    for optim in ("adamw", "muon"):  # the printed ratio is the table's: step time at depth 1 / at depth 2
        ratio = float(re.search(rf"minillama eager {optim}, step time L1 / L2: (\d+\.\d+)", out).group(1))
        assert ratio == pytest.approx(tps[f"minillama L2 eager {optim}"] / tps[f"minillama L1 eager {optim}"], rel=0.02)
    for depth in ("L2", "L1"):
        assert re.search(rf"minillama {depth} eager, step time muon / adamw: \d+\.\d+", out)
    assert "2,1 layers" in out


def test_bench_model_rejects_bad_depths():
    out = forked.run_script(REPO / "scripts" / "bench_model.py", "--layers", "6,0", "--no-hf")
    assert out.returncode == 1 and out.stderr.startswith("error: --layers 6,0: give distinct depths >= 1")


def test_bench_model_rejects_an_unknown_shape():
    out = forked.run_script(REPO / "scripts" / "bench_model.py", "--shape", "huge", "--no-hf")
    assert out.returncode == 1 and out.stderr.startswith("error: --shape huge: no configs/model/huge.yaml")


def test_bench_loss_chunked_peak_is_lower_with_the_same_loss(capsys, monkeypatch):
    monkeypatch.setattr(bench_loss.subprocess, "run", forked_run)  # each variant still measured in a process of its own
    bench_loss.main(
        [
            "--vocab",
            "8192",
            "--batch",
            "4",
            "--seq",
            "256",
            "--hidden",
            "64",
            "--layers",
            "1",
            "--steps",
            "1",
            "--threads",
            "1",
        ]
    )
    out = capsys.readouterr().out
    peaks = [
        float(v.replace(",", "")) for v in re.findall(r"\| ([\d,]+) MiB live \|", out)
    ]  # live tensors: not RSS noise
    losses = re.findall(r"\| (\d+\.\d{6}) \|$", out, re.M)
    assert len(peaks) == 2 and peaks[1] < peaks[0]  # one-shot, then chunked
    assert len(losses) == 2 and abs(float(losses[0]) - float(losses[1])) < 1e-5  # fp32 sums in another order


def test_bench_checkpoint_reports_save_and_verify_costs(capsys):
    from devtools.bench import checkpoint as bench_checkpoint

    assert bench_checkpoint.main(["--models", "tiny", "--repeats", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].endswith(" MB") and float(cells[2].split()[0]) > 0
    assert all(c.endswith(" s") and float(c.split()[0]) >= 0 for c in cells[3:6])


def test_bench_corpus_prepares_a_json_lines_corpus_with_each_encoder(tmp_path, monkeypatch):
    """The local-corpus benchmark at 0.3 MB: the corpus it builds, both encoders' runs and the memory rows."""
    from devtools.bench import corpus as bench_corpus

    size = bench_corpus.python_corpus(tmp_path / "c.jsonl", 0.3)
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert size >= 0.3 and rows and all(set(r) == {"text"} for r in rows)
    results = bench_corpus.measure_corpus(0.3, repeats=1)
    assert set(results) == {("tiktoken", "small"), ("tiktoken", "big"), ("tokenizers", "big")}
    assert results[("tiktoken", "big")]["train_encoder"] == "tiktoken"
    assert results[("tokenizers", "big")]["train_encoder"] == "tokenizers"
    assert results[("tiktoken", "big")]["train_tokens"] == results[("tokenizers", "big")]["train_tokens"]
    assert all(
        m["import_s"] > 0 and 0 < m["encode_start_mb"] <= m["encode_peak_mb"] <= m["peak_rss_mb"]
        for m in results.values()
    )
    table = "\n".join(bench_corpus.report_corpus(results))
    assert table.count("| tiktoken |") == 2 and table.count("| tokenizers |") == 1 and " MB |" in table
    assert " once started." in table  # the rate between the two tiktoken corpora


def test_bench_roofline_times_levers_side_by_side_and_groups_the_profiled_step(capsys):
    """Two variants of train.py's own step (the second an override), interleaved; the first profiled into op
    groups whose times add up to the profiled step, each with its work and share."""
    from devtools.bench import roofline

    roofline.main(
        [
            "debug=tiny",
            "--variant",
            "optim=muon",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--profile-steps",
            "2",
            "--threads",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert re.search(r"^\| as configured \| \d+ \| \d+–\d+ \| [\d,]+ \| 1\.000× \|$", out, re.M)
    assert re.search(r"^\| optim=muon \| \d+ \| \d+–\d+ \| [\d,]+ \| \d+\.\d{3}× \|$", out, re.M)
    rows = {
        m.group(1): float(m.group(2)) for m in re.finditer(r"^\| ([^|*]+?) \| (\d+\.\d) \| \d+\.\d % \|", out, re.M)
    }
    assert {"matmuls", "LM head matmuls", "attention", "norms", "MLP activation", "optimizer: elementwise"} <= set(rows)
    step = float(re.search(r"^\| \*\*step \(profiled\)\*\* \| \*\*(\d+\.\d)\*\*", out, re.M).group(1))
    assert sum(rows.values()) == pytest.approx(step, abs=0.1 * len(rows))  # every op in one group, none twice
    assert re.search(r"^\| matmuls \| [\d.]+ \| [\d.]+ % \| [\d.,]+ GFLOP \| [\d.]+ TFLOP/s \| \d+ % \|$", out, re.M)


@pytest.mark.parametrize(
    "name, shapes, in_optimizer, group",
    [
        ("graph_0_cpp_fused__log_softmax__to_copy_nll_loss_forward_9", [], False, "loss (log-softmax, NLL)"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", [], False, "attention"),
        ("aten::bmm", [[48, 256, 64], [48, 64, 256]], False, "attention"),
        ("graph_0_cpp_fused__softmax_masked_fill_3", [], False, "softmax, mask"),
        (
            "aten::mm",
            [[4096, 192], [192, 4096], [4096, 4096]],
            False,
            "LM head matmuls",
        ),  # forward, with inductor's out=
        ("aten::mm", [[4096, 4096], [4096, 192]], False, "LM head matmuls"),  # a gradient: tokens = vocab here
        ("aten::mm", [[192, 4096], [4096, 192]], False, "matmuls"),  # a block's weight gradient, same operands' sizes
        ("aten::addmm", [[1024], [4096, 192], [192, 1024]], False, "matmuls"),
        ("aten::addmm", [[192, 192], [192, 192], [192, 192]], True, "optimizer: Newton–Schulz matmuls"),
        ("aten::lerp", [], True, "optimizer: elementwise"),
        ("graph_0_cpp_fused__to_copy_add_mean_mul_pow_rsqrt_7", [], False, "norms"),
        ("graph_0_cpp_fused__to_copy_mul_silu_split_4", [], False, "MLP activation"),
        ("graph_0_cpp_fused__to_copy_add_cat_mul_neg_split_2", [], False, "RoPE"),
        ("aten::linalg_vector_norm", [], False, "gradient norm, clip"),
        ("graph_0_cpp_fused__to_copy_t_1", [], False, "casts, copies"),
    ],
)
def test_roofline_groups_each_op_by_what_it_computes(name, shapes, in_optimizer, group):
    from devtools.bench.roofline import group_of

    assert group_of(name, shapes, in_optimizer, (4096, 192, 4096)) == group


def test_roofline_work_counts_the_same_flops_as_the_mfu():
    """The matmul groups' FLOPs add up to Transformer.token_flops's 6·N + attention for the step's tokens (the MFU's
    numerator), and Muon's Newton–Schulz is counted from its matrices' shapes."""
    from cli.config import compose_train_config
    from devtools.bench.roofline import step_work
    from model import Transformer
    from training.distributed import DistInfo
    from training.loop import build

    cfg, _ = compose_train_config(["debug=tiny", "optim=muon"])
    parts = build(cfg, DistInfo(), say=lambda *a: None)
    work = step_work(cfg, parts)
    tokens = cfg.trainer.micro_batch_size * cfg.trainer.seq_len
    weights, attention = Transformer(cfg.model).token_flops(cfg.trainer.seq_len)
    assert work["matmuls"][0] + work["LM head matmuls"][0] == weights * tokens
    assert work["attention"] == (attention * tokens, "FLOP")
    shapes = [p.shape for p in parts.optimizers[0].param_groups[0]["params"]]
    steps = cfg.optim.muon_ns_steps
    assert work["optimizer: Newton–Schulz matmuls"][0] == sum(
        steps * (4 * min(s) ** 2 * max(s) + 2 * min(s) ** 3) for s in shapes
    )


def test_an_inductor_variant_compiles_the_configured_run_with_those_options(monkeypatch):
    """--inductor-variant "max_autotune=True cpp.threads=2": the same run's model + loss handed to torch.compile
    with exactly those options (typed); names inductor lacks, a run that does not compile, and a variant that
    falls back to eager (it would be timed as if compiled) are refused in one line."""
    from devtools.bench import roofline

    assert roofline.inductor_options("max_autotune=True cpp.threads=2") == {"max_autotune": True, "cpp.threads": 2}
    for bad in ("max_autotunes=True", "max_autotune"):
        with pytest.raises(ValueError, match="expected NAME=VALUE"):
            roofline.inductor_options(bad)
    calls = []
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: calls.append(kwargs) or module)
    _, parts, step = roofline.build_step(["debug=tiny", "trainer.compile=true"], {"max_autotune": True})
    assert calls[-1] == {"options": {"max_autotune": True}} and step.loss_module.module is parts.loss_module
    with pytest.raises(ValueError, match="needs a compiled run"):
        roofline.build_step(["debug=tiny"], {"max_autotune": True})
    with pytest.raises(ValueError, match="--inductor-variant: torch.compile failed"):
        roofline._refuse_eager("warning: torch.compile failed (RuntimeError: x); continuing without compile")


def test_each_matmul_group_is_measured_against_the_peak_of_the_dtype_it_runs_in():
    """Newton–Schulz may orthogonalise in bf16 while the run computes in fp32 (optim.muon_ns_dtype=auto on a CPU
    with bf16 in hardware): its % of roof is against its own dtype's peak, the other matmuls' against the run's."""
    from devtools.bench.roofline import NEWTON_SCHULZ, roofline

    groups = {"matmuls": 0.5, NEWTON_SCHULZ: 0.1}
    work = {"matmuls": (1e12, "FLOP"), NEWTON_SCHULZ: (2e11, "FLOP")}  # both achieve 2 TFLOP/s
    rows = "\n".join(roofline(groups, 0.6, work, matmul_peak=4e12, bandwidth=1e10, group_peaks={NEWTON_SCHULZ: 8e12}))
    assert "| matmuls | 500.0 | 83.3 % | 1,000.0 GFLOP | 2.00 TFLOP/s | 50 % |" in rows
    assert f"| {NEWTON_SCHULZ} | 100.0 | 16.7 % | 200.0 GFLOP | 2.00 TFLOP/s | 25 % |" in rows
    assert f"| {NEWTON_SCHULZ} | 100.0 | 16.7 % | 200.0 GFLOP | 2.00 TFLOP/s | 50 % |" in "\n".join(
        roofline(groups, 0.6, work, matmul_peak=4e12, bandwidth=1e10)
    )  # without its own peak: the run's


def test_bench_newton_schulz_compares_bf16_with_fp32_at_the_runs_shapes(capsys):
    from devtools.bench import newton_schulz

    newton_schulz.main(["model=tiny", "--repeats", "1", "--threads", "1"])
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
