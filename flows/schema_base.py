"""What job files and worker files share: the error they raise, strict models, reading YAML,
path resolution and one-line validation messages.

Unknown keys and bad values are errors that name the key; relative data paths resolve against
the config file's folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A job file is missing, unreadable or invalid."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}"
"""Party and data set names: 1-32 letters, digits, '_', '-'."""


def read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path}: cannot parse ({exc})") from None


def resolve_path(base: Path, path: Path | None) -> Path | None:
    return path if path is None or path.is_absolute() else base / path


def describe(exc: ValidationError) -> str:
    """One line per problem, each naming its key."""
    parts = []
    for err in exc.errors():
        key = ".".join(str(x) for x in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key {key!r}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"key {key!r}: {msg}" if err["loc"] else msg)
    return "; ".join(parts)
