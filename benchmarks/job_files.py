"""The shipped job files (``configs/``), loaded with sections overridden: what benchmarks and
tests run."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from flows.config import AnyJobConfig, parse_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def config_with(name: str, **overrides: Any) -> AnyJobConfig:
    """A shipped config with sections deep-merged from ``overrides`` (e.g. params={...})."""
    raw = yaml.safe_load((CONFIGS / name).read_text())
    raw = copy.deepcopy(raw)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return parse_config(raw, base=CONFIGS, source=name)
