"""What the parties keep of a SecureBoost model that stopped early (``flows.early_stopping``).

The flow decides on the validation curve; ``save_model`` then names how many trees every
party keeps (``Step.tree``; -1: all): the active party drops the trees after the best round
from its model part, each passive party the lookup records of those trees, so the parts
stay one consistent model.
"""

from __future__ import annotations

from messages.bodies import Step
from workers import ProtocolError
from workers.column_partitioned.lookup import LookupRecord


def kept_trees(body: Step, n_trees: int) -> int:
    """Trees the saved model keeps: the first ``body.tree``, or all of them (-1)."""
    if body.tree == -1:
        return n_trees
    if not 1 <= body.tree <= n_trees:
        raise ProtocolError(f"save_model keeps {body.tree} trees; 1 to {n_trees} were grown")
    return body.tree


def kept_records(records: dict[int, LookupRecord], body: Step) -> dict[int, LookupRecord]:
    """A passive party's lookup records of the trees the saved model keeps."""
    if body.tree == -1:
        return records
    if body.tree < 1:
        raise ProtocolError(f"save_model keeps {body.tree} trees")
    return {k: r for k, r in records.items() if 0 <= r.tree < body.tree}
