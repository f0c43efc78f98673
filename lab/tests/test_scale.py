"""lab/ablation/contrasts.py, the scale check: whether a variant's verdict keeps its direction across sizes, and rank agreement."""

import pytest

from lab.ablation import contrasts as scale
from lab.stats import judge


@pytest.mark.parametrize(
    "outcomes, text",
    [
        (["better", "better"], "**holds**: better at every size"),
        (["worse", "worse", "worse"], "**holds**: worse at every size"),
        (["better", "worse"], "**flips**"),
        (["better", "can't tell"], "partly: better where called"),
        (["can't tell", "can't tell"], "can't tell at any size"),
        (["better", None], "partly: better where called"),
        ([None, None], "not run"),
        (["equivalent", "equivalent"], "**holds**: equivalent at every size"),
        (["equivalent", "can't tell"], "partly: equivalent where shown, can't tell elsewhere"),
        (["worse", "equivalent"], "partly: worse where called"),
    ],
)
def test_consistency_of_verdicts_across_sizes(outcomes, text):
    assert scale.consistency(outcomes).startswith(text)


def test_rank_agreement_is_kendalls_tau():
    assert scale.rank_agreement(list("abcd"), list("abcd")) == pytest.approx(1.0)
    assert scale.rank_agreement(list("abcd"), list("dcba")) == pytest.approx(-1.0)
    assert scale.rank_agreement(list("abcd"), list("bacd")) == pytest.approx(2 / 3)  # one swapped pair of six
    assert scale.rank_agreement(list("ab"), list("ba")) is None  # two items: τ is only ever ±1


def test_markdown_lists_every_size_and_the_rankings():
    pairs = {"better": ([1.0, 1.1, 1.2], [1.1, 1.2, 1.31]), "unclear": ([1.0, 1.3, 1.1], [1.1, 1.1, 1.1])}
    verdicts = judge(pairs, "primary, own LR", 0.05, 0.01, "holm")
    better, unclear = verdicts["better"], verdicts["unclear"]
    verdicts = {"h96": {"gelu": better, "ln": unclear}, "h192": {"gelu": better}}
    text = scale.scale_markdown(verdicts, {"h96": ["gelu", "ref", "ln"], "h192": ["ref", "gelu", "ln"]}, "ref")
    gelu = next(line for line in text.splitlines() if line.startswith("| gelu"))
    assert gelu.count("(better)") == 2 and gelu.endswith("**holds**: better at every size |")
    ln = next(line for line in text.splitlines() if line.startswith("| ln"))
    assert "(can't tell)" in ln and "| — |" in ln  # not compared at h192
    assert "- h96: gelu < ref < ln" in text and "- h96 → h192: Kendall's τ = +0.33" in text
