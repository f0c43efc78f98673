"""docs/architecture.md's map, read from the source with `ast` and from a traced step: three parts — the framework,
the lab (lab/) and the developers' tools (dev/) — that import one way only (lab/ and dev/ import the framework, the
framework never imports them); inside the framework, model/ and data/ know nothing of each other or of Hydra, Hydra
only at the edge (train.py, training/cli.py, scripts/); no import cycles; nothing imports train.py, and only tests
import a script; one sys.path edit; the core — what train.py can import — within its limits of files and formatted
lines, and a plain step entering at most five files outside model/."""

import ast
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from tests.train_helpers import train_in_process

REPO = Path(__file__).resolve().parents[1]
HYDRA = {"hydra", "omegaconf"}
PACKAGES = ("model", "data", "training", "interop", "analysis")  # the framework's library
PARTS = ("lab", "dev")  # beside the framework: they import it, it never imports them
NEVER = {  # package → top-level modules it must never import (the "never" column of the doc)
    "model": {"data", "training", "interop", "analysis", "scripts", "train", *PARTS} | HYDRA,
    "data": {"model", "training", "interop", "analysis", "scripts", "train", *PARTS} | HYDRA,
    "training": {
        "interop",
        "analysis",
        "scripts",
        "train",
        *PARTS,
    },  # Hydra: training/cli.py and program.py only (below)
    "interop": {"analysis", "scripts", "train", *PARTS} | HYDRA,
    "analysis": {"interop", "scripts", "train", *PARTS} | HYDRA,  # statistics run nothing
    "scripts": {"train", *PARTS},  # the user's programs never need the lab or the developers' tools
    "lab": {"dev", "train"},
    "dev": {"lab", "train"},
}
EDGE = (
    "train.py",
    "training/cli.py",
    "training/program.py",
    "scripts/",
    "lab/",
    "dev/",
)  # where Hydra and OmegaConf may be imported
# Who may touch sys.path: scripts/_bootstrap.py (`python scripts/x.py` puts scripts/, not the repository,
# first on it), and the test helpers that start a script the way a fresh interpreter does — the script's
# folder first: forked.py (a child forked from the preloaded server), fault_injection.py (it runs train.py
# under injected faults), golden_curve.py (run as `python tests/golden_curve.py` to bless the curves).
SYS_PATH_EDITORS = {"scripts/_bootstrap.py", "tests/forked.py", "tests/fault_injection.py", "tests/golden_curve.py"}
MAX_MODULES_PER_FOLDER = 15
# The core (every file train.py can import, lazy imports included; formatted by `ruff format`): a ratchet at what it
# is, so that the core never grows back: lower them when it shrinks, raise them only for a feature, said here.
CORE_MAX_FILES, CORE_MAX_LINES, STEP_MAX_FILES_OUTSIDE_MODEL = 25, 6598, 5


def python_files(*roots: str, repo: Path = REPO) -> list:
    """The .py files of these folders (recursively) and files, relative to repo."""
    found = []
    for root in roots:
        path = repo / root
        found += [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    return [p.relative_to(repo) for p in found]


ALL_CODE = ("train.py", *PACKAGES, "scripts", *PARTS, "tests")
PROGRAM_CODE = ("train.py", *PACKAGES, "scripts", *PARTS)  # everything but the tests


def imported_modules(path: Path) -> dict:
    """Top-level module → first line importing it, for every absolute import in the file, including
    those inside functions (a lazy import is still a dependency)."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            found.setdefault(name.split(".")[0], node.lineno)
    return found


def module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(repo: Path = REPO, roots=("train.py", *PACKAGES, *PARTS)) -> dict:
    """module → the project's modules it imports: `from a.b import c` is a.b.c when that is a module,
    else a.b; `import a.b.c` the deepest of a.b.c, a.b, a that is one of the project's modules."""
    files = {module_name(p): repo / p for p in python_files(*roots, repo=repo)}

    def resolve(name: str):
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {resolve(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, one level up per extra dot
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}" if base else alias.name
                    targets.add(full if full in files else resolve(base))
        graph[module] = sorted(t for t in targets if t and t != module)
    return graph


def import_cycles(graph: dict) -> list:
    """Every strongly connected group of more than one module (Tarjan), each sorted: [] when acyclic."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return cycles


def edits_sys_path(path: Path) -> list:
    """Lines that touch `sys.path` (insert, append, assignment, …)."""
    return sorted(
        {
            node.lineno
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        }
    )


@pytest.mark.parametrize("package", [*PACKAGES, "scripts", *PARTS])
def test_package_never_imports_what_the_architecture_forbids(package):
    files = [p for p in sorted((REPO / package).rglob("*.py")) if "tests" not in p.relative_to(REPO).parts]
    assert files, f"{package}/ has no Python files"
    violations = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in files
        for name, line in imported_modules(path).items()
        if name in NEVER[package] and not (path == REPO / "training" / "cli.py" and name == "interop")  # init_from=<HF>
    ]
    assert not violations, "\n".join(violations)


def test_the_framework_never_imports_the_lab_or_the_developers_tools():
    """The one-way rule between the three parts, over every framework file, tests of the framework included: the lab and
    dev/ may go (a user who clones only the framework loses nothing) and the framework still runs and tests."""
    violations = [
        f"{path}:{line} imports {name}"
        for path in python_files("train.py", *PACKAGES, "scripts", "configs", "tests")
        for name, line in imported_modules(REPO / path).items()
        if name in PARTS
    ]
    hydra_targets = [  # a Hydra config can name a class to instantiate: none of the framework's names the lab's
        str(path.relative_to(REPO))
        for path in (REPO / "configs").rglob("*.yaml")
        if re.search(r"_target_:\s*(lab|dev)\.", path.read_text())
    ]
    assert not violations and not hydra_targets, violations + hydra_targets


def test_the_checker_sees_lazy_and_dotted_imports(tmp_path):
    """A rule checker that cannot fail would prove nothing: it must catch what a slip looks like."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nfrom data.tokenizer import SPECIAL_TOKENS\n\n"
        "def f():\n    from omegaconf import OmegaConf\n    import hydra.utils\n"
        "from . import sibling\n"
    )
    assert imported_modules(sample) == {"os": 1, "data": 2, "omegaconf": 5, "hydra": 6}


def test_hydra_is_used_at_the_edge():
    # The rule below is about the libraries; the edge really is where the config system lives.
    assert "hydra" in imported_modules(REPO / "train.py")
    assert "hydra" in imported_modules(REPO / "training" / "cli.py")


def test_hydra_and_omegaconf_only_at_the_edge():
    """Outside the tests (which check configs), only train.py, training/cli.py and program.py, scripts/, lab/ and dev/ import Hydra or
    OmegaConf: the library below them reads typed dataclasses, never a DictConfig."""
    violations = [
        f"{path}:{line} imports {name}"
        for path in python_files(*PROGRAM_CODE)
        if not str(path).startswith(EDGE)
        for name, line in imported_modules(REPO / path).items()
        if name in HYDRA
    ]
    assert not violations, "\n".join(violations)


def test_nothing_imports_train_py_and_only_tests_import_a_script():
    """train.py and scripts/*.py are run; a test of a program imports its module from scripts/ (`from scripts import
    generate`), nothing else does."""
    violations = [
        f"{path}:{line} imports {name}"
        for path in python_files(*ALL_CODE)
        for name, line in imported_modules(REPO / path).items()
        if name == "train" or (name == "scripts" and not str(path).startswith(("tests/", "lab/tests/", "dev/tests/")))
    ]
    assert not violations, "\n".join(violations)


def test_each_script_is_a_whole_program():
    """scripts/ holds the programs themselves (no door that only imports another module): each defines its main,
    imports _bootstrap before any module of ours (the repository on sys.path), and runs main as a program."""
    programs = [p for p in python_files("scripts") if p.name != "_bootstrap.py"]
    assert len(programs) >= 8
    for path in programs:
        text = (REPO / path).read_text()
        tree = ast.parse(text)
        first_party = {"_bootstrap", "train", *PACKAGES, "scripts", *PARTS}
        imports = [
            n.names[0].name if isinstance(n, ast.Import) else n.module
            for n in tree.body
            if isinstance(n, (ast.Import, ast.ImportFrom))
        ]
        assert [m for m in imports if m.split(".")[0] in first_party][0] == "_bootstrap", path
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), path
        assert 'if __name__ == "__main__":' in text, path


def test_sys_path_is_edited_only_by_the_bootstrap_and_the_script_runners():
    violations = [
        f"{path}:{line}"
        for path in python_files(*ALL_CODE)
        if str(path) not in SYS_PATH_EDITORS
        for line in edits_sys_path(REPO / path)
    ]
    assert not violations, "sys.path edited at " + ", ".join(violations)


def test_the_sys_path_checker_sees_an_edit(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import sys\nprint(sys.argv)\n\ndef f():\n    sys.path[:0] = ['x']\n")
    assert edits_sys_path(sample) == [5]


def test_no_import_after_code():
    """Imports come first: no comment excuses a late one with `noqa: E402` (a script's path set-up is
    scripts/_bootstrap.py, imported first)."""
    marked = []
    for path in python_files(*ALL_CODE):
        with open(REPO / path, encoding="utf-8") as f:
            marked += [
                f"{path}:{t.start[0]}"
                for t in tokenize.generate_tokens(f.readline)
                if t.type == tokenize.COMMENT and "E402" in t.string
            ]
    assert not marked, marked


def core_files(repo: Path = REPO) -> set:
    """Every project file train.py can import, transitively, imports anywhere in a file included (a lazy import is
    still what a reader follows), and each package's __init__.py that importing runs — as ../shared/tools/core_size.py
    counts them."""

    def module_file(name: str):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            base = repo.joinpath(*parts[:i])
            for f in (base.with_suffix(".py"), base / "__init__.py"):
                if f.is_file():
                    return f
        return None

    seen, todo = set(), [repo / "train.py"]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        package = f.relative_to(repo).with_suffix("").parts[:-1]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = list(package[: len(package) - node.level + 1]) if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [mod] + [f"{mod}.{a.name}" if mod else a.name for a in node.names]
            for name in names:
                if (g := module_file(name)) is not None:
                    todo.append(g)
                    p = g.parent
                    while p != repo and (p / "__init__.py").is_file():
                        todo.append(p / "__init__.py")
                        p = p.parent
    return seen


def test_the_core_stays_within_its_files_and_lines():
    core = core_files()
    lines = sum(len(f.read_text().splitlines()) for f in core)
    assert len(core) <= CORE_MAX_FILES, sorted(str(f.relative_to(REPO)) for f in core)
    assert lines <= CORE_MAX_LINES, f"the core grew to {lines} lines (limit {CORE_MAX_LINES}): what can go?"
    assert REPO / "interop" / "hf.py" in core and REPO / "interop" / "hf_export.py" not in core  # init_from's side only


def test_the_core_counter_follows_lazy_imports_and_package_inits(tmp_path):
    (tmp_path / "train.py").write_text("import a.b\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "a" / "b.py").write_text("def f():\n    from a import c\n")
    (tmp_path / "a" / "c.py").write_text("x = 1\n")
    (tmp_path / "a" / "d.py").write_text("x = 1\n")  # not imported: not the core
    assert {f.relative_to(tmp_path).as_posix() for f in core_files(tmp_path)} == {
        "train.py",
        "a/__init__.py",
        "a/b.py",
        "a/c.py",
    }


def test_no_package_folder_holds_more_than_15_modules():
    folders = {p.parent for p in python_files(*PACKAGES, *PARTS) if p.parts[-2] != "tests"}
    crowded = {str(f): n for f in folders if (n := len(list((REPO / f).glob("*.py")))) > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"give these a subpackage (modules): {crowded}"


def test_no_import_cycles():
    graph = import_graph()
    assert "training.cli" in graph and "lab.ablation.runner" in graph  # the whole project, subpackages included
    assert not import_cycles(graph)


def test_the_cycle_finder_sees_a_cycle_through_a_package(tmp_path):
    """a.b imports a (the package), whose __init__ imports a.c, which imports a.b: one cycle of three."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text("from a.c import x\n")
    (tmp_path / "a" / "b.py").write_text("from a import x\n")
    (tmp_path / "a" / "c.py").write_text("def f():\n    from .b import y\n")
    (tmp_path / "a" / "d.py").write_text("from a import b\n")  # a module of the package: an edge to a.b only
    graph = import_graph(tmp_path, roots=("a",))
    assert graph["a.d"] == ["a.b"]
    assert import_cycles(graph) == [["a", "a.b", "a.c"]]


def test_a_training_runs_start_imports_no_statistics_interop_or_plotting_library():
    """train.py and the lab's Hydra callback (which writes an ablation cell's status file) as a run starts: statsmodels
    and scipy.stats cost about a second of every start, transformers and matplotlib more. They belong to the
    analysis and interop commands, imported where used (analysis/power.py)."""
    heavy = {"statsmodels", "scipy", "transformers", "matplotlib", "pandas"}
    code = f"import sys, train, lab.launcher; print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def package_table(doc: str) -> dict:
    """{package folder: its row's text} from docs/architecture.md's "The packages" table."""
    section = doc.split("## The packages", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`") and cells[0].endswith("/`"):
            rows[cells[0].strip("`").rstrip("/")] = cells[1]
    return rows


def undocumented_modules(repo: Path = REPO) -> list:
    """Every package folder without a row, and every module its row does not name as `name.py`."""
    text = (repo / "docs" / "architecture.md").read_text()
    rows = package_table(text.replace("## The other packages", "## The packages"))
    missing = []
    for folder in sorted(
        {
            p.parent
            for package in (*PACKAGES, *PARTS)
            for p in (repo / package).rglob("*.py")
            if "__pycache__" not in p.parts and "tests" not in p.relative_to(repo).parts
        }
    ):
        name = folder.relative_to(repo).as_posix()
        if name not in rows:
            missing.append(f"{name}/ (no row)")
            continue
        missing += [
            f"{name}/{p.name}"
            for p in sorted(folder.glob("*.py"))
            if p.name != "__init__.py" and f"`{p.name}`" not in rows[name]
        ]
    return missing


def test_every_module_is_in_the_architecture_docs_package_table():
    """The map names every module: a new module, or a new package, fails here until its row says what it is."""
    assert undocumented_modules() == []


def test_the_package_table_check_finds_a_module_and_a_package_the_doc_leaves_out(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text(
        "## The packages\n\n| package | modules |\n|---|---|\n| `model/` | `norm.py` (RMSNorm) |\n\n## Next\n"
    )
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "x.py").write_text("")
    (tmp_path / "model" / "norm.py").write_text("")
    (tmp_path / "model" / "mlp.py").write_text("")
    missing = undocumented_modules(tmp_path)
    assert "model/mlp.py" in missing and "data/ (no row)" in missing and "model/norm.py" not in missing


# Module → module imports across packages that the map allows, where it makes a claim: analysis/ and interop/
# read training's files (training/checkpoint.py, training/log.py's metrics) and price runs with its one cost model
# (training/budget.py); coord_check.py trains its widths the way train.py does. A new import from training into any
# of them fails here until the map says why.
TRAINING_FILES = {"training.checkpoint", "training.log", "training.budget"}
MAY_IMPORT_FROM_TRAINING = {
    "analysis": {"*": TRAINING_FILES},
    "interop": {"*": TRAINING_FILES},
}


def imports_from_training_beyond_the_map(graph: dict) -> list:
    found = []
    for module, targets in sorted(graph.items()):
        allowed = MAY_IMPORT_FROM_TRAINING.get(module.split(".")[0])
        if allowed is None:
            continue
        ok = allowed["*"] | allowed.get(module, set())
        found += [f"{module} → {t}" for t in targets if t.split(".")[0] == "training" and t not in ok]
    return found


def test_analysis_and_interop_import_from_training_only_what_the_map_allows():
    assert imports_from_training_beyond_the_map(import_graph()) == []


def test_the_module_allow_list_sees_an_import_it_does_not_allow():
    graph = {
        "analysis.runs": ["training.log", "training.loop"],
        "analysis.stats": ["training.optim"],
        "scripts.x": ["training.loop"],
    }
    assert imports_from_training_beyond_the_map(graph) == [
        "analysis.runs → training.loop",
        "analysis.stats → training.optim",
    ]


# A resume's steps, each called from one place: training/checkpoint.py's Resume.restore (issue 37: resume is one
# call), and the metrics position rewound by the loop right after it (training/log.py owns metrics.jsonl).
RESUME_STEPS = ("restore_rng", "move_aside_later_checkpoints", "load_full_state", "from_json", "rewind_metrics")


def callers_of(names, files) -> dict:
    """{name: [files that call it]} over `files` (relative to REPO), by the AST: `f(…)` and `x.f(…)`."""
    found = {}
    for rel in files:
        for node in ast.walk(ast.parse((REPO / rel).read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in names:
                    found.setdefault(name, set()).add(str(rel))
    return {name: sorted(where) for name, where in found.items()}


def test_a_resume_is_restored_in_one_module():
    """Every step of a resume runs from training/checkpoint.py (Resume.restore) but the metrics' rewind, which the loop
    calls right after it: the resume path is one place to read, and a second caller of any step fails here."""
    files = python_files(*PACKAGES, "scripts", *PARTS, "train.py")
    assert callers_of(RESUME_STEPS, files) == {
        **{name: ["training/checkpoint.py"] for name in RESUME_STEPS},
        "rewind_metrics": ["training/loop.py"],
    }


def test_the_resume_caller_check_sees_a_second_caller(tmp_path):
    (tmp_path / "elsewhere.py").write_text("from x import restore_rng\nrestore_rng({})\n")
    assert callers_of(RESUME_STEPS, [tmp_path / "elsewhere.py"]) == {"restore_rng": [str(tmp_path / "elsewhere.py")]}


def traced_plain_steps(tiny_data_cache) -> set:
    """Every file of ours whose code runs during plain steps — steps 2 and 3 of a run with the default's optimizer
    (Muon) and length (a time budget and passes over the data: here 0.002 of a pass, 12 steps), logging, validating
    and saving only at its end — from the call of step 2 to the call of step 4, under sys.setprofile: what
    core_size.py's --steps counts."""
    import tempfile

    import training.loop as loop

    seen, real = set(), loop.TrainStep.__call__

    def profiler(frame, event, arg):
        path = Path(frame.f_code.co_filename)
        if (
            event == "call"
            and REPO in path.parents
            and "tests" not in path.relative_to(REPO).parts[:1]
            and ".venv" not in path.parts
        ):
            seen.add(path.relative_to(REPO).as_posix())

    def traced(self, n):
        sys.setprofile(profiler if n in (2, 3) else None)
        return real(self, n)

    loop.TrainStep.__call__ = traced
    try:
        with tempfile.TemporaryDirectory() as tmp:
            train_in_process(
                Path(tmp) / "run",
                "trainer.time_budget=10",
                "trainer.max_epochs=0.002",
                "trainer.log_interval=100",
                "trainer.eval_interval=100",
                "trainer.ckpt_interval=100",
                "optim.name=muon",
                cache_dir=tiny_data_cache,
            )
    finally:
        sys.setprofile(None)
        loop.TrainStep.__call__ = real
    return seen


@pytest.mark.serial  # trains
def test_a_plain_step_enters_the_files_the_walk_through_names_five_outside_the_model(tiny_data_cache):
    """docs/architecture.md's "One training step, file by file" names exactly the files a plain step runs code in: a
    file it names that the step never enters, or one the step enters that it does not name, fails here — and the
    step enters at most five outside model/ (the loop, the loader, the optimizers, the logger, the budget)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text[text.index("## One training step, file by file") : text.index("## Who may import whom")]
    block = block.split("```")[1]
    named = set(re.findall(r"([\w/]+\.py)", block))
    entered = traced_plain_steps(tiny_data_cache)
    assert named == entered
    outside = {f for f in entered if not f.startswith("model/")}
    assert len(outside) <= STEP_MAX_FILES_OUTSIDE_MODEL, sorted(outside)
