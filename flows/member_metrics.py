"""Training metrics of a row-partitioned (horizontal) model over every member's rows, from
each member's own: what horizontal SecureBoost and SimFL report per tree."""

from __future__ import annotations

import math
from typing import Any

from messages.bodies import TreeFinished


def combine_member_metrics(replies: dict[str, TreeFinished]) -> dict[str, Any]:
    """Training metrics over all members' rows: logloss and RMSE exactly (they add up over
    rows); AUC as the row-weighted mean of the members' own AUCs."""
    # in name order: the sums do not depend on the order the replies arrived in
    per_member = {m: {x.name: x.value for x in replies[m].metrics} for m in sorted(replies)}
    total = sum(v.get("rows", 0.0) for v in per_member.values())
    combined: dict[str, Any] = {}
    if total > 0:
        # what every member reports (the builder's own extras stay under "members")
        names = set.intersection(*(set(v) for v in per_member.values())) - {"rows"}
        for name in sorted(names):
            if name.endswith("_rmse"):
                combined[name] = math.sqrt(sum(v["rows"] * v[name] ** 2
                                               for v in per_member.values()) / total)
            else:
                combined[name] = sum(v["rows"] * v[name] for v in per_member.values()) / total
    combined["members"] = per_member
    return combined
