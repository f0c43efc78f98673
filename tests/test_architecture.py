"""The import rules of docs/architecture.md, read from the source with `ast`: model/ and data/ know
nothing of each other or of Hydra; Hydra only at the edge (train.py, scripts/); no upward imports."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HYDRA = {"hydra", "omegaconf"}
PACKAGES = ("model", "data", "training", "interop", "analysis")
NEVER = {  # package → top-level modules it must never import (the "never" column of the doc)
    "model": {"data", "training", "interop", "analysis", "train", "scripts"} | HYDRA,
    "data": {"model", "training", "interop", "analysis", "train", "scripts"} | HYDRA,
    "training": {"interop", "analysis", "train", "scripts"} | HYDRA,
    "interop": {"analysis", "train", "scripts"} | HYDRA,
    "analysis": {"interop", "train", "scripts"} | HYDRA,
}


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


@pytest.mark.parametrize("package", PACKAGES)
def test_package_never_imports_what_the_architecture_forbids(package):
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"{package}/ has no Python files"
    violations = [f"{path.relative_to(REPO)}:{line} imports {name}"
                  for path in files for name, line in imported_modules(path).items() if name in NEVER[package]]
    assert not violations, "\n".join(violations)


def test_the_checker_sees_lazy_and_dotted_imports(tmp_path):
    """A rule checker that cannot fail would prove nothing: it must catch what a slip looks like."""
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom data.tokenizer import SPECIAL_TOKENS\n\n"
                      "def f():\n    from omegaconf import OmegaConf\n    import hydra.utils\n"
                      "from . import sibling\n")
    assert imported_modules(sample) == {"os": 1, "data": 2, "omegaconf": 5, "hydra": 6}


def test_hydra_is_used_at_the_edge():
    # The rule above is about the libraries; the edge really is where the config system lives.
    assert "hydra" in imported_modules(REPO / "train.py")
    assert any("omegaconf" in imported_modules(p) for p in (REPO / "scripts").glob("*.py"))
