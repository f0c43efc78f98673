"""Optional stopping, guarded. Every look at the results (a report written) is recorded with the seeds each
group (recipe, or the protocol's measuring seeds) had planned. Seeds beyond an earlier look's need a stated
sequential design (--sequential): each look is then judged at α / K, K the number of looks with distinct
seed sets so far, this one included — Bonferroni over the looks, conservative whatever made one stop."""

import time
from typing import Dict, List, Sequence, Tuple

Looks = List[dict]  # [{"time": …, "seeds": {group: [seeds]}, "sequential": bool}, …]


class LookError(ValueError):
    """Seeds would be added after a look without a sequential design: one line that says what to do."""


def looked(looks: Looks, group: str) -> set:
    return {int(s) for look in looks for s in (look.get("seeds") or {}).get(group, [])}


def check_added_seeds(looks: Looks, planned: Dict[str, Sequence[int]], sequential: bool, how: str) -> None:
    """Refuse to run seeds of a group beyond those an earlier look judged, unless `sequential`.
    how: what to tell the user instead (e.g. 'or use a new --dir')."""
    if sequential:
        return
    for group, seeds in planned.items():
        seen = looked(looks, group)
        added = sorted(set(seeds) - seen)
        if seen and added:
            raise LookError(
                f"{group}: seeds {', '.join(map(str, added))} would be added after a look at seeds "
                f"{', '.join(map(str, sorted(seen)))} — optional stopping inflates false positives; pass "
                f"--sequential to run them under a sequential design (each look judged at α / looks), {how}"
            )


def record(looks: Looks, seeds: Dict[str, Sequence[int]], sequential: bool) -> Looks:
    """The looks with this one appended (unless it judges the same seeds as the last one did)."""
    entry = {"seeds": {g: sorted(int(s) for s in v) for g, v in seeds.items() if v}, "sequential": bool(sequential)}
    if looks and {k: v for k, v in looks[-1].items() if k != "time"} == entry:
        return list(looks)
    return [*looks, {"time": time.strftime("%Y-%m-%d %H:%M:%S"), **entry}]


def alpha_for(alpha: float, looks: Looks, group: str) -> Tuple[float, int]:
    """(the level a group is judged at, K): α itself until a sequential look added seeds, then α / K with K
    the distinct seed sets looked at. Looks made without --sequential never split α (none added seeds)."""
    sets = []
    for look in looks:
        seeds = tuple((look.get("seeds") or {}).get(group, []))
        if seeds and seeds not in sets:
            sets.append(seeds)
    k = len(sets) if any(look.get("sequential") for look in looks) else 1
    return alpha / max(1, k), max(1, k)
