"""The ablation protocol: what it trains. Variants × sizes × an LR grid (stage 1, one seed), then
every variant at its own best LR on N seeds (stage 2), as cells — one train.py run each."""
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

from analysis.spec_file import read_spec_fields

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # directory- and Hydra-safe: it names cells' directories


class ProtocolError(ValueError):
    """Bad protocol input: the message is one line that names the value and what would be right."""


@dataclass
class Spec:
    variants: Dict[str, List[str]]  # name → train.py value overrides (key.sub=value) on top of the preset
    reference: str  # the variant every other one is compared with
    lr_grid: List[float]  # stage 1: each variant tries each of these (log-spaced)
    seeds: List[int]  # stage 2: every variant at its best LR on each of these
    sizes: Dict[str, List[str]] = field(default_factory=lambda: {"base": []})  # name → model overrides
    stage1_seed: int = 0  # if in `seeds`, stage 2 reuses the stage-1 run at the chosen LR as that seed's run
    min_lr_ratio: float = 0.1  # optim.min_lr = ratio × optim.lr, so the schedule's shape is the same at every LR
    experiment: Optional[str] = None  # the train.py preset (configs/experiment/<name>.yaml) every cell starts from
    train_overrides: List[str] = field(default_factory=list)  # applied to every cell, e.g. trainer.max_steps=…

    def __post_init__(self):
        self.variants = {str(k): list(v or []) for k, v in self.variants.items()}
        self.sizes = {str(k): list(v or []) for k, v in (self.sizes or {"base": []}).items()}
        self.lr_grid = [float(lr) for lr in self.lr_grid]
        self.seeds = [int(s) for s in self.seeds]
        for kind, names in (("variant", self.variants), ("size", self.sizes)):
            for name in names:
                _require(NAME.match(name), f"{kind} name {name!r} must be letters, digits, '_' or '-' "
                                           "(it names directories), e.g. no_norm")
        _require(self.variants, "the protocol has no variants; list at least the reference and one other")
        _require(self.reference in self.variants, f"reference {self.reference!r} is not among the variants "
                                                  f"({', '.join(self.variants)}); add it or pick one of them")
        _require(self.lr_grid and all(0 < lr < math.inf for lr in self.lr_grid),
                 f"lr_grid {self.lr_grid} must list positive, finite learning rates, e.g. 1e-3,3e-3,1e-2")
        _require(len(set(self.lr_grid)) == len(self.lr_grid), f"lr_grid {self.lr_grid} repeats a value")
        _require(self.seeds and len(set(self.seeds)) == len(self.seeds) and min(self.seeds) >= 0,
                 f"seeds {self.seeds} must be distinct non-negative integers (at least one)")
        _require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1], e.g. 0.1")
        for owner, overrides in [*self.variants.items(), *self.sizes.items()]:
            for o in overrides:
                key = o.split("=", 1)[0]
                _require("=" in o and "." in key and not key.startswith(("+", "~", "hydra")),
                         f"{owner}: {o!r} is not a value override key.sub=value (config groups such as "
                         "model=25m go to the whole protocol, on the command line)")
                _require(key not in ("optim.lr", "optim.min_lr", "seed", "run_name"),
                         f"{owner}: {key} is set by the protocol itself (lr_grid, min_lr_ratio, seeds)")

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


def stage1_cells(spec: Spec) -> List[Cell]:
    """Every variant at every LR of the grid, at every size, with the stage-1 seed."""
    return [Cell(size, variant, lr, spec.stage1_seed) for size in spec.sizes for variant in spec.variants
            for lr in spec.lr_grid]


def stage2_cells(spec: Spec, chosen: Dict[str, Dict[str, Optional[float]]]) -> List[Cell]:
    """Every variant at its own chosen LR, at every size, on every seed; a variant that diverged at
    every LR (chosen None) has no stage 2. Seeds outermost, so a stopped stage holds whole seeds."""
    return [Cell(size, variant, chosen[size][variant], seed) for seed in spec.seeds for size in spec.sizes
            for variant in spec.variants if chosen.get(size, {}).get(variant) is not None]


def choose_lr(final_bpb: Dict[float, Optional[float]]) -> Optional[float]:
    """The LR with the lowest final val bpb among the runs that finished with a finite value
    (diverged runs are None); None when no LR did."""
    finite = {lr: bpb for lr, bpb in final_bpb.items() if bpb is not None and math.isfinite(bpb)}
    return min(finite, key=lambda lr: (finite[lr], lr)) if finite else None


def at_grid_edge(lr: float, grid: Sequence[float]) -> bool:
    """The chosen LR is the smallest or largest tried: the optimum may lie outside the grid."""
    return len(grid) > 1 and lr in (min(grid), max(grid))


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
    """A protocol file (configs/protocol/*.yaml): the Spec's fields as YAML."""
    raw = read_spec_fields(path, Spec, ProtocolError, "protocol file")
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
        _require(sep and "." in key and values,
                 f"--sizes {term!r} is not key.sub=v1,v2,… (e.g. model.hidden_size=96,192)")
        parsed.append((key, values.split(",")))
    counts = {len(values) for _, values in parsed}
    _require(len(counts) == 1, f"--sizes {' '.join(terms)}: every term needs the same number of values (zipped)")
    sizes = {}
    for i in range(counts.pop()):
        overrides = [f"{key}={values[i]}" for key, values in parsed]
        name = ",".join(f"{key.rsplit('.', 1)[-1]}{values[i]}" for key, values in parsed)
        sizes[re.sub(r"[^A-Za-z0-9_-]", "_", name)] = overrides
    return sizes
