"""A passive party's report: what it holds or learns of a run, nothing more (the job's size
and its own splits, from its lookup table); the rest stays with the active party."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from fedboost.report_html import section, table

if TYPE_CHECKING:
    from fedboost.report import PartyView


def passive_note(job: dict[str, Any], view: PartyView) -> str:
    """What a data provider's report leaves out, and why."""
    complete = bool((job.get("params") or {}).get("complete_secure"))
    text = (f"<p>The data provider's view: what party <b>{escape(view.party)}</b> holds or "
            f"learns, its own splits (its lookup table) and the job's size. The trees' shape, "
            f"the other parties' splits, split gains, leaf values, the metrics and leaf "
            f"purity stay with the active party (they come from its labels), and so does "
            f"where the time went (the flow's record).")
    if complete:
        text += (" This run is <b>Completely SecureBoost</b>: the first tree was grown on the "
                 "active party's features alone, so this party holds no split of it.")
    return section("view", "What this party holds", text + "</p>")


def own_splits(view: PartyView) -> str:
    """A passive party's splits, tree by tree, as its lookup table holds them."""
    if not view.lookup:
        return section("trees", "Own splits", "<p>This party owns no split.</p>")
    records = sorted(view.lookup.items(), key=lambda item: (item[1].tree, item[1].depth,
                                                             item[0]))
    rows = [[r.tree if r.tree >= 0 else "-", r.depth if r.depth >= 0 else "-", ident,
             view.own_names[r.feature], f"{r.threshold:.4g}"] for ident, r in records]
    trees = sorted({r.tree for _, r in records if r.tree >= 0})
    return section("trees", "Own splits", f"<p>{len(records)} splits in {len(trees)} trees "
                    f"on this party's features (value &le; threshold goes to the child its "
                    f"record names).</p>" + table(["tree", "depth", "record", "feature",
                                                   "threshold"], rows))
