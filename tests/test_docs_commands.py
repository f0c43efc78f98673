"""Every `python train.py …` (and `torchrun … train.py …`) command that README.md and docs/ show composes into a run train.py would start:
its overrides pass every check resolve_config makes, and its model builds (on the meta device). A documented
command that ends in `error:` as written fails here, not in a newcomer's terminal."""

import pytest
import torch

from model import Transformer
from tests.doc_commands import DOCS, fenced_python_commands, has_placeholder
from training.cli import check_override_keys
from training.program import compose_run_config


def documented_train_commands(paths=DOCS) -> list:
    """(where, overrides) of each `python train.py` command in a code block. Left out: `resume=` and `init_from=`
    (they need a run on disk: test_faults.py, test_init_from.py cover them) and placeholders like `<run>` or `…`.
    A sweep (`-m k=a,b`) is checked as its first job."""
    found = []
    for where, words in fenced_python_commands(paths):
        if words[:1] != ["train.py"]:
            continue
        words = words[1:]
        if any(w.startswith(("resume=", "init_from=")) for w in words) or has_placeholder(words):
            continue
        if "-m" in words:  # a sweep: each of its jobs composes like its first one
            words = [w if "=" not in w else w.split(",")[0] for w in words if w != "-m"]
        found.append((where, words))
    return found


COMMANDS = documented_train_commands()


def test_the_docs_show_train_commands():
    assert len(COMMANDS) >= 20  # the collection itself works: README's and docs/training.md's examples, torchrun's


@pytest.mark.parametrize("where, overrides", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_train_command_composes_and_its_model_builds(where, overrides):
    check_override_keys(overrides)  # what train.py checks before Hydra
    cfg = compose_run_config(overrides)
    with torch.device("meta"):  # the model builds (heads divide the width, sizes round as documented), no memory
        assert Transformer(cfg.model).param_counts()["total"] > 0


def test_the_collection_reads_code_blocks_only_and_strips_comments(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "python train.py in prose\n```bash\npython train.py model.n_layers=2   # two\n"
        "python train.py resume=latest\n.venv/bin/python train.py data.path='my/*.txt'\n"
        "torchrun --standalone --nproc_per_node=8 train.py trainer=gpu \\\n    trainer.parallel=fsdp\n```\n"
    )
    assert [w for _, w in documented_train_commands([doc])] == [
        ["model.n_layers=2"],
        ["data.path=my/*.txt"],
        ["trainer=gpu", "trainer.parallel=fsdp"],
    ]
