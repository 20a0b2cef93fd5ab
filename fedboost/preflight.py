"""Checks of a job that need neither Prefect nor a worker, run before either starts.

Starting the ephemeral Prefect server and the parties' workers takes tens of seconds on a busy
machine; a missing file, a misnamed column or an undeclared text column is then reported one
line at a time, that late. These checks read what the job names on this machine first.
"""

from __future__ import annotations

from typing import Any

from workers.data import load_party_data

QUICK_CHECK_ROWS = 1000
"""Rows of each party's file read before the run: its worker still checks every row."""


def check_party_files(parties: dict[str, Any], objective: str | None = None) -> None:
    """The first rows of every party's file of an embedded job (``parties``: a job config's),
    read as its worker will read them (labels checked for ``objective``); raises
    ``workers.DataError`` naming the party, file, row and column."""
    for name, party in parties.items():
        if not getattr(party, "data", None):  # an aggregator holds no data
            continue
        labelled = party.role in ("active", "member")
        load_party_data(name, party.data, party.id, party.label if labelled else None,
                        require_label=labelled, columns=party.columns,
                        categorical=getattr(party, "categorical", None), rows=QUICK_CHECK_ROWS,
                        objective=objective if labelled else None)
