"""The protocol's spec, what it trains and how it is judged, fixed before anything trains; and its cells (one train.py
run each): stage 1's LR sweeps on a seed of their own, stage 2's measuring seeds, and where each cell stands."""

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import yaml

from lab import stats as power
from lab.ablation.lr_search import Sweep, sweep
from lab.sweep import DONE, State
from lab.sweep import inspect as inspect_dir

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # directory- and Hydra-safe: it names cells' directories
MULTITEST = ("holm", "bonferroni", "holm-sidak", "hommel")  # family-wise methods of statsmodels' multipletests
MIN_SEEDS = 3  # with 2 seeds a paired t-test has 1 degree of freedom: its p-values are not worth a verdict
TIERS = ("primary", "secondary")


class ProtocolError(ValueError):
    """Bad protocol input: the message is one line that names the value and what would be right."""


@dataclass
class Spec:
    variants: Dict[str, List[str]]  # name → train.py value overrides (key.sub=value) on top of the preset
    reference: str  # the variant every other one is compared with
    lr_grid: List[float]  # stage 1: each variant tries each of these (log-spaced), then past an edge
    seeds: Union[List[int], str]  # stage 2's measuring seeds, or "auto": as many as target_mde needs
    sizes: Dict[str, List[str]] = field(default_factory=lambda: {"base": []})  # name → model overrides
    stage1_seed: int = 100  # the LR sweep's seed: never a measuring seed, so no LR is picked on a measurement
    min_lr_ratio: float = 0.1  # optim.min_lr = ratio × optim.lr, so the schedule's shape is the same at every LR
    experiment: Optional[str] = None  # the train.py preset (configs/experiment/<name>.yaml) every cell starts from
    train_overrides: List[str] = field(default_factory=list)  # applied to every cell, e.g. trainer.max_steps=…
    lr_extensions: int = 2  # a best LR at the grid's edge adds a point beyond it, at most this many times
    lr_tie_tolerance: float = 0.0  # bpb: stage-1 LRs within this of the best are a tie, and the smallest wins
    variant_sizes: Dict[str, List[str]] = field(default_factory=dict)  # variant → the only sizes it runs at
    # The pre-registration: which contrasts (variant vs reference) are primary, which secondary (each
    # tier a family, Holm-adjusted over its contrasts × sizes), the margin of "equivalent", the plan's power.
    primary: List[str] = field(default_factory=list)
    secondary: List[str] = field(default_factory=list)  # empty: every other variant
    alpha: float = 0.05  # family-wise error rate of each family
    multitest: str = "holm"  # statsmodels.stats.multitest.multipletests method
    equivalence_margin: float = 0.01  # bpb: "equivalent" = TOST shows |Δ| < margin
    power: float = power.POWER  # of the paired t-test at the family's strictest Holm step (α / m)
    target_mde: float = 0.02  # bpb: the primaries' minimum detectable effect that seeds: auto aims at
    planning_sd: Optional[float] = None  # bpb: spread of per-seed paired differences the plan assumes
    planning_sd_source: str = ""  # where planning_sd was measured (--spread-from fills it in)
    max_seeds: int = 10  # seeds: auto never plans more
    # The cost a dry run prints before anything here has run: size → training tokens/s a timing run measured
    # on one machine (planning_tokens_per_s_source names it). Another machine may be 2-4× off; a protocol's
    # own runs, or --probe-steps N, replace it.
    planning_tokens_per_s: Dict[str, float] = field(default_factory=dict)
    planning_tokens_per_s_source: str = ""
    # μP transfer (docs/mup.md): a size whose stage-1 LRs every size reuses — the LR sweep runs only there,
    # every cell trains under model.parametrization=mup with that size's width as the base. Sizes must then
    # differ in width alone: μP makes the best LR width-independent, not depth-independent.
    transfer_from: Optional[str] = None

    def __post_init__(self):
        self.variants = {str(k): list(v or []) for k, v in self.variants.items()}
        self.sizes = {str(k): list(v or []) for k, v in (self.sizes or {"base": []}).items()}
        self.lr_grid = sorted(float(lr) for lr in self.lr_grid)
        for kind, names in (("variant", self.variants), ("size", self.sizes)):
            for name in names:
                _require(
                    NAME.match(name),
                    f"{kind} name {name!r} must be letters, digits, '_' or '-' (it names directories), e.g. no_norm",
                )
        _require(self.variants, "the protocol has no variants; list at least the reference and one other")
        _require(
            self.reference in self.variants,
            f"reference {self.reference!r} is not among the variants "
            f"({', '.join(self.variants)}); add it or pick one of them",
        )
        _require(
            self.lr_grid and all(0 < lr < math.inf for lr in self.lr_grid),
            f"lr_grid {self.lr_grid} must list positive, finite learning rates, e.g. 1e-3,2e-3,4e-3",
        )
        _require(len(set(self.lr_grid)) == len(self.lr_grid), f"lr_grid {self.lr_grid} repeats a value")
        _require(self.lr_extensions >= 0, f"lr_extensions={self.lr_extensions} must be >= 0")
        _require(
            0 <= self.lr_tie_tolerance < 1,
            f"lr_tie_tolerance={self.lr_tie_tolerance} must be a bpb margin in [0, 1), e.g. 0.01",
        )
        _require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1], e.g. 0.1")
        self.variant_sizes = {str(k): [str(x) for x in v or []] for k, v in (self.variant_sizes or {}).items()}
        for variant, sizes in self.variant_sizes.items():
            _require(
                variant in self.variants and variant != self.reference,
                f"variant_sizes: {variant} is not a variant other than the reference (the reference runs at "
                "every size, or no contrast has a partner)",
            )
            _require(
                sizes and set(sizes) <= set(self.sizes),
                f"variant_sizes: {variant} lists {sizes}; pick one or more of the sizes {', '.join(self.sizes)}",
            )
        self._check_preregistration()
        self._check_transfer()
        if self.seeds == "auto":
            self.seeds = list(range(self.planned_seed_count()[0]))
        _require(isinstance(self.seeds, list), f"seeds={self.seeds!r} must be a list of seeds or 'auto'")
        self.seeds = [int(s) for s in self.seeds]
        _require(
            self.seeds and len(set(self.seeds)) == len(self.seeds) and min(self.seeds) >= 0,
            f"seeds {self.seeds} must be distinct non-negative integers (at least one)",
        )
        _require(
            self.stage1_seed not in self.seeds,
            f"stage1_seed={self.stage1_seed} is also a measuring seed: the LR would be chosen on a run that "
            f"is then measured; pick a seed outside {self.seeds}, e.g. 100",
        )
        for owner, overrides in [*self.variants.items(), *self.sizes.items()]:
            for o in overrides:
                key = o.split("=", 1)[0]
                _require(
                    "=" in o and "." in key and not key.startswith(("+", "~", "hydra")),
                    f"{owner}: {o!r} is not a value override key.sub=value (config groups such as "
                    "model=25m go to the whole protocol, on the command line)",
                )
                _require(
                    key not in ("optim.lr", "optim.min_lr", "seed", "run_name"),
                    f"{owner}: {key} is set by the protocol itself (lr_grid, min_lr_ratio, seeds)",
                )

    def _check_preregistration(self) -> None:
        others = [v for v in self.variants if v != self.reference]
        self.primary = [str(v) for v in self.primary or []]
        self.secondary = [str(v) for v in self.secondary or []] or [v for v in others if v not in self.primary]
        for tier in TIERS:
            unknown = [v for v in getattr(self, tier) if v not in others]
            _require(
                not unknown,
                f"{tier}: {', '.join(unknown)} not among the variants other than the reference "
                f"({', '.join(others) or 'none'})",
            )
        both = set(self.primary) & set(self.secondary)
        _require(not both, f"{', '.join(sorted(both))} both primary and secondary; a contrast has one family")
        untiered = [v for v in others if v not in self.primary and v not in self.secondary]
        _require(not untiered, f"{', '.join(untiered)} in neither primary nor secondary; name its family")
        _require(0 < self.alpha < 0.5, f"alpha={self.alpha} must be in (0, 0.5), e.g. 0.05")
        _require(self.multitest in MULTITEST, f"multitest={self.multitest!r} must be one of {', '.join(MULTITEST)}")
        _require(self.equivalence_margin > 0, f"equivalence_margin={self.equivalence_margin} must be > 0 (bpb)")
        _require(0 < self.power < 1, f"power={self.power} must be in (0, 1), e.g. 0.8")
        _require(self.target_mde > 0, f"target_mde={self.target_mde} must be > 0 (bpb)")
        _require(self.planning_sd is None or self.planning_sd > 0, f"planning_sd={self.planning_sd} must be > 0")
        _require(self.max_seeds >= MIN_SEEDS, f"max_seeds={self.max_seeds} must be >= {MIN_SEEDS}")
        self.planning_tokens_per_s = {str(k): float(v) for k, v in (self.planning_tokens_per_s or {}).items()}
        for size, rate in self.planning_tokens_per_s.items():
            _require(rate > 0, f"planning_tokens_per_s: {size}: {rate} must be > 0 (training tokens per second)")

    def _check_transfer(self) -> None:
        if self.transfer_from is None:
            return
        self.transfer_from = str(self.transfer_from)
        _require(
            self.transfer_from in self.sizes,
            f"transfer_from={self.transfer_from!r} is not a size "
            f"({', '.join(self.sizes)}); name the size to tune at, e.g. the narrowest",
        )
        missing = [v for v in self.variants if not self.runs_at(v, self.transfer_from)]
        _require(
            not missing,
            f"transfer_from={self.transfer_from}: {', '.join(missing)} never run(s) there, so "
            "no LR could be tuned for them; add the size to their variant_sizes",
        )
        for owner, overrides in [
            ("train_overrides", self.train_overrides),
            *self.sizes.items(),
            *self.variants.items(),
        ]:
            for o in overrides:
                key, _, value = o.lstrip("+").partition("=")
                _require(
                    key != "model.parametrization" or value == "mup",
                    f"transfer_from needs model.parametrization=mup, but {owner} sets {o}: under SP the best "
                    "LR moves with width, so a tuned LR would not transfer; drop it or drop transfer_from",
                )

    @property
    def sweep_sizes(self) -> List[str]:
        """The sizes stage 1 sweeps LRs at: all of them, or only transfer_from's."""
        return [self.transfer_from] if self.transfer_from else list(self.sizes)

    def family(self, tier: str) -> List[str]:
        """The variants whose contrast with the reference is in the tier's family."""
        return self.primary if tier == "primary" else self.secondary

    def runs_at(self, variant: str, size: str) -> bool:
        return size in self.variant_sizes.get(variant, self.sizes)

    def variants_at(self, size: str) -> List[str]:
        return [v for v in self.variants if self.runs_at(v, size)]

    def family_tests(self, tier: str) -> List[tuple]:
        """(size, variant) of every test in the tier's family: its contrasts at the sizes they run at."""
        return [(size, v) for size in self.sizes for v in self.family(tier) if self.runs_at(v, size)]

    def family_alpha(self, tier: str) -> float:
        """The strictest level Holm applies in the tier's family (its first step): α / its number of tests."""
        return self.alpha / max(1, len(self.family_tests(tier)))

    @property
    def tiers(self) -> List[str]:
        """The tiers that have a family (each adjusted on its own)."""
        return [tier for tier in TIERS if self.family(tier)]

    def mde(self, tier: str, sd: float) -> float:
        """The MDE of the tier's family at spread sd: the planned seeds at its strictest level and the plan's power."""
        return power.mde(sd, len(self.seeds), self.family_alpha(tier), self.power)

    def planned_seed_count(self) -> tuple:
        """(seeds to run, seeds the target needs or None if unreachable): the fewest whose primary MDE at
        planning_sd is at most target_mde, between MIN_SEEDS and max_seeds."""
        _require(
            self.planning_sd is not None,
            "seeds: auto needs planning_sd (the spread of per-seed paired "
            "differences, bpb); set it or give a list of seeds",
        )
        needed = power.seeds_for(self.target_mde, self.planning_sd, self.family_alpha("primary"), self.power)
        return min(self.max_seeds, max(MIN_SEEDS, needed or self.max_seeds)), needed

    def overrides(self, *more: str) -> List[str]:
        """What a run of the protocol composes from: its preset, train_overrides, then `more` (a key given again takes
        more's value)."""
        return [
            *([f"experiment={self.experiment}"] if self.experiment else []),
            *merge_overrides(self.train_overrides, more),
        ]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Cell:
    """One train.py run: a variant at a size, a learning rate and a seed."""

    size: str
    variant: str
    lr: float
    seed: int

    @property
    def run_name(self) -> str:
        """Also its directory under the protocol's runs/: size/variant/lr…_seed…"""
        return f"{self.size}/{self.variant}/lr{self.lr:g}_seed{self.seed}"

    @property
    def option(self) -> str:
        """Its name as a Hydra config option (+cell=…): no '/', '.' or '+'."""
        return re.sub(r"[^A-Za-z0-9_-]", "", self.run_name.replace("/", "__").replace(".", "p"))


def stage1_cells(spec: Spec, done: Optional[Dict[Cell, Optional[float]]] = None) -> List[Cell]:
    """Every variant at every LR of its sweep, at every size, on the stage-1 seed: the grid, plus the
    extensions the results so far call for (`done`: final bpb of finished cells, None = diverged)."""
    return [
        Cell(size, variant, lr, spec.stage1_seed)
        for size in spec.sweep_sizes
        for variant in spec.variants_at(size)
        for lr in lr_sweep(spec, size, variant, done).lrs
    ]


def lr_sweep(spec: Spec, size: str, variant: str, done: Optional[Dict[Cell, Optional[float]]] = None) -> Sweep:
    """Where one (size, variant)'s LR sweep stands, from the finished (or diverged) stage-1 cells."""
    results = {
        c.lr: bpb for c, bpb in (done or {}).items() if (c.size, c.variant, c.seed) == (size, variant, spec.stage1_seed)
    }
    return sweep(spec.lr_grid, results, spec.lr_extensions, spec.lr_tie_tolerance)


def stage2_cells(spec: Spec, chosen: Dict[str, Dict[str, Optional[float]]]) -> List[Cell]:
    """Every variant on every measuring seed at its own chosen LR and, for the shared-LR contrast, at the
    reference's (one cell when the two coincide); a variant that diverged at every LR has no own-LR cells.
    Seeds outermost, so a stopped stage holds whole seeds."""
    cells = []
    for seed in spec.seeds:
        for size in spec.sizes:
            per_size = chosen.get(size, {})
            shared = per_size.get(spec.reference)
            for variant in spec.variants_at(size):
                if variant not in per_size:  # its sweep is not settled yet
                    continue
                lrs = [per_size[variant]] + ([shared] if variant != spec.reference else [])
                cells += [Cell(size, variant, lr, seed) for lr in dict.fromkeys(lr for lr in lrs if lr is not None)]
    return cells


@dataclass
class CellState(State):
    cell: Optional[Cell] = None


def inspect(cell: Cell, runs_dir: Path) -> CellState:
    return CellState(**vars(inspect_dir(runs_dir / cell.run_name)), cell=cell)


def done_bpb(states: Dict[Cell, CellState]) -> Dict[Cell, Optional[float]]:
    """{cell: final bpb} of the cells that will not run again (None = diverged): what LR sweeps read."""
    return {c: s.final_bpb for c, s in states.items() if s.state in DONE}


def stage1_states(spec: Spec, inspect_cells: Callable[[List[Cell]], Dict[Cell, CellState]]) -> Dict[Cell, CellState]:
    """The states of every stage-1 cell: the grid's, then the extensions its results call for, then
    theirs, until no new cell appears (an extension not yet run is MISSING and ends the walk)."""
    cells = stage1_cells(spec)
    while True:
        states = inspect_cells(cells)
        more = [c for c in stage1_cells(spec, done_bpb(states)) if c not in states]
        if not more:
            return states
        cells = [*cells, *more]


def chosen_lrs(spec: Spec, states: Dict[Cell, CellState]) -> Dict[str, Dict[str, Optional[float]]]:
    """{size: {variant: best stage-1 LR}} for the variants whose LR sweep is settled (every LR done and
    no extension called for); None for a variant that diverged at every LR. Variants still sweeping are
    left out. Under transfer_from every size takes the transfer size's choices (μP: the same best LR)."""
    done, chosen = done_bpb(states), {size: {} for size in spec.sizes}
    for size in spec.sweep_sizes:
        for variant in spec.variants_at(size):
            sweep = lr_sweep(spec, size, variant, done)
            if sweep.settled:
                chosen[size][variant] = sweep.best
    if spec.transfer_from:
        tuned = chosen[spec.transfer_from]
        for size in spec.sizes:
            chosen[size] = {v: tuned[v] for v in spec.variants_at(size) if v in tuned}
    return chosen


def split_overrides(overrides) -> tuple:
    """(train.py overrides, launcher overrides): anything under hydra is how runs are launched."""
    launcher = [o for o in overrides if o.lstrip("+~").startswith("hydra")]
    return [o for o in overrides if o not in launcher], launcher


def merge_overrides(base, new) -> list:
    """`base` updated by `new`: a key given again takes the new value, new keys are added."""
    keys = {o.split("=", 1)[0].lstrip("+") for o in new}
    return [o for o in base if o.split("=", 1)[0].lstrip("+") not in keys] + list(new)


def _require(ok, message: str) -> None:
    if not ok:
        raise ProtocolError(message)


def load_spec_file(path) -> Spec:
    """A protocol file (lab/configs/protocol/*.yaml): the Spec's fields as YAML; one line naming what is wrong."""
    known = ", ".join(Spec.__dataclass_fields__)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ProtocolError(f"cannot read protocol file {path} ({type(e).__name__}: {str(e).splitlines()[0]})")
    if not isinstance(raw, dict):
        raise ProtocolError(f"protocol file {path} is not a mapping of its fields ({known})")
    if unknown := sorted(set(raw) - set(Spec.__dataclass_fields__)):
        raise ProtocolError(f"protocol file {path}: unknown field(s) {', '.join(unknown)}; the fields are {known}")
    try:
        return Spec(**raw)
    except TypeError as e:
        raise ProtocolError(f"protocol file {path}: {e}")


def parse_sizes(terms: Sequence[str]) -> Dict[str, List[str]]:
    """['model.hidden_size=96,192', 'model.n_heads=2,4'] → {'hidden_size=96,n_heads=2': [...], ...}:
    sweep-style terms, zipped (every term lists the same number of values)."""
    parsed = []
    for term in terms:
        key, sep, values = term.partition("=")
        _require(
            sep and "." in key and values, f"--sizes {term!r} is not key.sub=v1,v2,… (e.g. model.hidden_size=96,192)"
        )
        parsed.append((key, values.split(",")))
    counts = {len(values) for _, values in parsed}
    _require(len(counts) == 1, f"--sizes {' '.join(terms)}: every term needs the same number of values (zipped)")
    sizes = {}
    for i in range(counts.pop()):
        overrides = [f"{key}={values[i]}" for key, values in parsed]
        name = ",".join(f"{key.rsplit('.', 1)[-1]}{values[i]}" for key, values in parsed)
        sizes[re.sub(r"[^A-Za-z0-9_-]", "_", name)] = overrides
    return sizes
