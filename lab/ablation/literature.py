"""What the literature says about the primary contrasts, and whether this study agrees: a paragraph per
claim, filled in from the verdicts (agree / disagree / can't tell), with why a study this small may
not agree. A claim is found by what its variant changes (model.mlp=gelu, model.norm=layernorm), not
by the variant's name."""

from dataclasses import dataclass
from typing import Dict, List, Sequence

from lab.ablation.contrasts import LR_CHOICES, LR_WORDS, Contrast
from lab.stats import BETTER, CANT_TELL, EQUIVALENT, WORSE


@dataclass(frozen=True)
class Claim:
    override: str  # what the variant changes against the reference
    title: str
    says: str
    agree: Sequence[str]  # the variant's outcomes (variant − reference) that agree with the claim
    disagree: Sequence[str]
    why_not_here: str


CLAIMS = (
    Claim(
        "model.mlp=gelu",
        "SwiGLU vs GELU at matched parameters",
        "SwiGLU beat a GELU MLP of the same parameter count in language-model pre-training (Shazeer 2020, "
        "*GLU Variants Improve Transformer*) and was among the few modifications that held up across "
        "implementations (Narang et al. 2021, *Do Transformer Modifications Transfer Across Implementations "
        "and Applications?*): GELU should be **worse**",
        agree=(WORSE,),
        disagree=(BETTER, EQUIVALENT),
        why_not_here="those gains were measured at ~10⁸ parameters and ~10⁹–10¹⁰ tokens; here the models are "
        "under 10⁶ parameters trained on one epoch's worth of ~2M Shakespeare tokens (random "
        "windows, drawn with replacement) on a CPU, where "
        "the gate's extra multiplicative path has had little data to pay off, and a gap of the "
        "papers' size (a few hundredths of a nat) is close to this study's detectable effect",
    ),
    Claim(
        "model.norm=layernorm",
        "RMSNorm vs LayerNorm",
        "RMSNorm matched LayerNorm's quality while running faster (Zhang & Sennrich 2019, *Root Mean Square "
        "Layer Normalization*): LayerNorm should be **equivalent** (or worse), never better",
        agree=(EQUIVALENT, WORSE),
        disagree=(BETTER,),
        why_not_here="the claim is one of no difference, which only an equivalence test can support: with few "
        "seeds 'can't tell' is the expected answer, not a disagreement; its speed half is a GPU "
        "kernel argument, and at these widths on CPU the norm is a small part of a step",
    ),
)


def _word(outcome: str, claim: Claim) -> str:
    if outcome in claim.agree:
        return "agrees"
    if outcome in claim.disagree:
        return "disagrees"
    return "can't tell"


def claim_for(variant_overrides: Sequence[str]) -> List[Claim]:
    return [c for c in CLAIMS if c.override in variant_overrides]


def paragraph(variants: Dict[str, List[str]], primary: Sequence[str], contrasts: List[Contrast]) -> str:
    """One paragraph per literature claim a primary variant tests, from its verdicts at both LR choices."""
    out = []
    for variant in primary:
        for claim in claim_for(variants.get(variant, [])):
            parts, words = [], set()
            for choice in LR_CHOICES:
                found = [c for c in contrasts if c.variant == variant and c.choice == choice and c.tier == "primary"]
                if not found:
                    continue
                each = [f"{c.size}: {c.verdict.outcome} ({_word(c.verdict.outcome, claim)})" for c in found]
                words |= {_word(c.verdict.outcome, claim) for c in found}
                parts.append(f"{LR_WORDS[choice]}, {'; '.join(each)}")
            overall = _overall(words)
            out.append(
                f"**{claim.title}** (`{variant}`). The literature: {claim.says}. This study **{overall}** — "
                + " — ".join(parts)
                + "."
                + ("" if overall == "agrees" else f" Why it may not agree at this scale: {claim.why_not_here}.")
            )
    return "\n\n".join(out) + ("\n" if out else "")


def _overall(words: set) -> str:
    if words == {"agrees"}:
        return "agrees"
    if words == {"disagrees"}:
        return "disagrees"
    if "agrees" in words and "disagrees" in words:
        return "is mixed (agrees at some sizes or LR choices, disagrees at others)"
    if not words or words == {CANT_TELL}:
        return "can't tell"
    return "partly " + ("agrees" if "agrees" in words else "disagrees") + " (can't tell elsewhere)"
