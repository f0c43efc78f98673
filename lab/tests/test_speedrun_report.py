"""lab/speedrun/report.py's verdicts: 3 paired seeds on their own spread, 2 against the pooled spread of
every recipe's paired differences (stated), none on 1 degree of freedom; a sequential look at α / looks."""

from analysis.stats import decimals, format_p, paired_t, pooled_paired_t
from lab import power
from lab import speedrun as S
from lab.looks import record
from lab.speedrun.report import report


def speedrun_results(**bpbs):
    """{recipe: {seed: result}} from {recipe: [bpb per seed]}, every run on budget."""
    return {
        name: {
            seed: {"bpb": b, "loop_s": 100.0, "max_steps": 10, "tokens": 1000, "tokens_per_s": 10.0, "flags": []}
            for seed, b in enumerate(values)
        }
        for name, values in bpbs.items()
    }


def rows_of(text):
    return {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}


def test_two_seeds_are_judged_against_the_pooled_spread_and_say_so():
    """A 2-seed paired test has 1 degree of freedom: its p-values are not worth a verdict. With 2 seeds the
    report judges a recipe against the sd of every recipe's paired differences pooled, and says so."""
    spec = S.Spec(
        recipes={"base": [], "a": ["optim.lr=1e-2"], "b": ["optim.lr=2e-2"], "c": ["optim.lr=3e-2"]}, reference="base"
    )
    results = speedrun_results(base=[2.00, 2.02], a=[1.94, 1.97], b=[2.01, 2.02], c=[2.03, 2.04])
    text = report(spec, results, {}, "m")
    sd = power.pooled_sd({"a": [-0.06, -0.05], "b": [0.01, 0.0], "c": [0.03, 0.02]})  # 3 dof
    t = pooled_paired_t([1.94, 1.97], [2.00, 2.02], sd, 3)
    row = rows_of(text)["a"]
    assert t.p < 0.05 and f"better by {abs(t.delta):.{decimals(t.half_width)}f}" in row
    assert f"2 paired seeds, pooled sd {sd:.4f} (3 dof)" in row
    assert paired_t([1.94, 1.97], [2.00, 2.02]).p > 0.05  # its own 1-dof test could not have said so
    assert "against the pooled sd of every recipe's per-seed differences" in text and "p = <" not in text


def test_three_seeds_use_their_own_spread_and_no_pool_means_no_verdict():
    spec = S.Spec(recipes={"base": [], "a": ["optim.lr=1e-2"]}, reference="base")
    alone = rows_of(report(spec, speedrun_results(base=[2.00, 2.02], a=[1.94, 1.97]), {}, "m"))["a"]
    assert "no verdict: 2 paired seeds (1 dof) and no pooled spread of 2+ dof" in alone
    three = rows_of(report(spec, speedrun_results(base=[2.00, 2.02, 2.01], a=[1.94, 1.97, 1.95]), {}, "m"))["a"]
    t = paired_t([1.94, 1.97, 1.95], [2.00, 2.02, 2.01])
    assert f"{format_p(t.p)} |" in three and "3 paired seeds" in three and "pooled" not in three


def test_a_sequential_look_judges_at_alpha_over_the_looks():
    """Campaign 1 added a third seed after p = 0.059 on two: under --sequential the third look is judged at
    0.05 / 2, and the report says so."""
    spec = S.Spec(recipes={"base": [], "a": ["optim.lr=1e-2"]}, reference="base")
    results = speedrun_results(base=[2.2752, 2.2844, 2.2694], a=[2.2071, 2.2026, 2.2056])  # docs/speedrun.md
    looks = record(record([], {"a": [0, 1], "base": [0, 1]}, False), {"a": [0, 1, 2], "base": [0, 1, 2]}, True)
    row = rows_of(report(spec, results, {}, "m", looks))["a"]
    assert "better by 0.071 ± 0.023 bpb (95 % CI), p = 0.0058, 3 paired seeds, α = 0.025 over 2 looks" in row
