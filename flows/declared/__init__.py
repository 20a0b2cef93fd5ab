"""What each protocol declares about itself to the flows and the commands.

A protocol's declaration (``flows.declared.<protocol>.PROTOCOL``) gives its job file's schema,
its title, its training flow, the stage each of its steps belongs to, and the traits the
commands ask instead of branching on protocol names: whether every member ends with the whole
model, what ``serve-model`` scores, what the centralized reference trains. Importing a
declaration is light (no Prefect): the flow itself is imported only when a run needs it.

The built-in protocols are listed in ``BUILT_IN`` (one line each); protocols outside fedboost
are the packages ``FEDBOOST_PROTOCOLS`` names, whose ``protocol`` module holds a ``PROTOCOL``
(``messages.kinds``; docs/protocols.md, "How to add a protocol").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from messages.kinds import Kind, extra_protocols

BUILT_IN = ("flows.declared.secureboost", "flows.declared.horizontal", "flows.declared.simfl",
            "flows.declared.forest")
"""The declarations of fedboost's own protocols, by module."""


@dataclass(frozen=True)
class ProtocolDeclaration:
    """One protocol, as the flows and the commands see it."""

    name: str
    """What a job file's ``protocol:`` calls it."""
    title: str
    schema: type
    """The job file's schema (a pydantic model with ``protocol: Literal[name]``)."""
    flow: str
    """Its training flow, ``module:function`` (the function takes the job's config)."""
    stages: Mapping[Kind, str] = field(default_factory=dict)
    """Steps outside the per-tree loop, by the stage the progress bar shows them in (openers
    are "opening" without being listed; every other step grows trees)."""
    shared_model: bool = False
    """Every member ends with the whole model (horizontal, SimFL): each scores its own rows,
    alone; ``serve-model`` does not serve it, and a run counts rows, not aligned rows."""
    scored_as: str | None = None
    """The model kind ``serve-model``'s scoring service reports (``boosting``, ``forest``);
    None: the service does not score it."""
    reference: str | None = "boosting"
    """What ``fedboost centralized`` trains on the joined data: ``boosting``, or None with
    ``no_reference`` saying why not."""
    no_reference: str = ""
    reference_shares_cuts: bool = False
    """The centralized reference bins with the cuts the members share (horizontal)."""

    def training_flow(self) -> Callable[[Any], dict[str, Any]]:
        """The flow (imported now: it imports Prefect)."""
        module, _, name = self.flow.partition(":")
        flow: Callable[[Any], dict[str, Any]] = getattr(importlib.import_module(module), name)
        return flow


def declared() -> dict[str, ProtocolDeclaration]:
    """Every protocol: the built-in ones, then those ``FEDBOOST_PROTOCOLS`` names now."""
    modules = [*BUILT_IN, *(f"{package}.protocol" for package in extra_protocols())]
    found: dict[str, ProtocolDeclaration] = {}
    for module in modules:
        protocol: ProtocolDeclaration = importlib.import_module(module).PROTOCOL
        if protocol.name in found:
            raise ValueError(f"protocol {protocol.name} is declared twice ({module})")
        found[protocol.name] = protocol
    return found


def declaration(name: str) -> ProtocolDeclaration:
    """The protocol a job file's ``protocol:`` names (KeyError if none)."""
    return declared()[name]
