"""A study's YAML file (an ablation protocol) read into the fields of its Spec
dataclass, with one-line errors that name the file and what is wrong in it."""

from pathlib import Path

import yaml


def read_spec_fields(path, spec_type, error: type, what: str) -> dict:
    """The file's mapping, refused (as `error`) when unreadable, not a mapping, or with unknown fields."""
    known = ", ".join(spec_type.__dataclass_fields__)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise error(f"cannot read {what} {path} ({type(e).__name__}: {str(e).splitlines()[0]})")
    if not isinstance(raw, dict):
        raise error(f"{what} {path} is not a mapping of its fields ({known})")
    unknown = sorted(set(raw) - set(spec_type.__dataclass_fields__))
    if unknown:
        raise error(f"{what} {path}: unknown field(s) {', '.join(unknown)}; the fields are {known}")
    return raw
