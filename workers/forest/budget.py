"""How many of its features a forest's passive party sums per node, over a whole job.

The active party draws each node's features with a secret key (``boosting.forest.node_rng``),
so a passive party cannot check a draw. It can check their number. An active party that asks
every passive feature at every node, with labels it chose in the honest 1-bit shape and
row-block splits on its own features down to two-row nodes, read 7,240 of breast's 11,380
passive cells in one tree (issue 36): each two-row node with one row labelled 1 shows both
rows' bins of every feature asked. An honest draw of ``k(N)`` of the federation's ``N``
features (``boosting.forest.features_per_node``) gives this party ``X`` of its ``n`` own ones,
hypergeometric with mean ``n k(N) / N``, which for every ``N >= n`` is at most ``g(n)``:
``sqrt(n)`` (``sqrt``), ``log2 n`` (``log2``, ``n >= 3``) or ``f n`` (a fraction ``f``), at
least 1 (``k >= 1`` draws). A node is asked about only when ``X >= 1``, and ``E[X | X >= 1] <=
1 + g(n)`` (checked exactly for every ``n < 120``, ``N < 400`` and rule in the tests). So this
party sums, per level over the job's trees, at most ``1 + g(n)`` features per node asked,
plus a slack of ``n`` (one node with all of them) and four standard deviations: the party
never needs the federation's feature count, and an honest job stays far inside (breast:
3.3 features per node asked against a budget of 5.5).

What it bounds: the features per node on average, so the cells a chosen-label attack reads
per tree fall by about ``n / (1 + g(n))`` (a fraction ``max_features`` of 1 gives no bound).
What it does not: over more trees the attack reads the other features of the same rows, as an
honest-but-curious active party reads some at every small node; the job's
``min_samples_leaf`` (every node holds two leaves' worth of distinct rows) is what bounds a
node's rows.

The running sums are kept per passive data set, over every forest job on it, in a ledger in
the party's private folder (:class:`FeatureLedger`, ``forest-features.json``), written before
the histograms leave: a worker restarted mid-job, a job run again under another name and a
second job over the same rows all go on from the sums already spent, so the slack (``n``
features and four standard deviations per level) is the data set's once, not each job's or
each worker process's (in memory only, as before issue 36, a restart or a new job gave it
afresh: ``tests/privacy/test_malicious_active.py``). Jobs of different ``max_features`` rules
share it: each request adds its own rule's honest mean to the level's allowance.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

from boosting.tree import open_private
from workers import ProtocolError

log = logging.getLogger("fedboost.worker")

SLACK_SDS = 4.0
"""Standard deviations of slack above the honest bound (the variance of a hypergeometric
count is at most its mean): an honest job's running sum stays below it but for chance far
smaller than 1e-4 per level, and its mean sits below the bound anyway."""


def mean_features_bound(rule: str, n_features: int) -> float:
    """``1 + g(n)``: the most features an honest draw sums per node asked, on average."""
    n = n_features
    if rule == "sqrt":
        g = math.sqrt(n)
    elif rule == "log2":
        g = math.log2(max(n, 3)) * n / max(n, 3)
    else:
        g = float(rule) * n
    return 1.0 + max(1.0, g)


def check_features_summed(party: str, rule: str, n_features: int, depth: int,
                          summed: tuple[int, int], asked: list[int]) -> tuple[int, int]:
    """The level's running (nodes, features) over the job with this request's nodes added,
    or a ``ProtocolError`` (logged) if the features exceed what honest draws sum."""
    nodes, features = summed[0] + len(asked), summed[1] + sum(asked)
    mean = mean_features_bound(rule, n_features)
    allowed = mean * nodes + n_features + SLACK_SDS * math.sqrt(mean * nodes)
    _refuse_beyond(party, rule, n_features, depth, asked, nodes, features, mean, allowed, "")
    return nodes, features


LEDGER_FILE = "forest-features.json"
"""In the passive party's private folder: per data set and level, the (nodes, features,
allowance) its forest jobs have summed."""


def dataset_digest(data_file: str, names: Sequence[str]) -> str:
    """A passive data set's name in the ledger: the SHA-256 of its file and the columns used."""
    h = hashlib.sha256()
    with open(data_file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    h.update(repr(list(names)).encode())
    return h.hexdigest()


class FeatureLedger:
    """The features a passive party has summed per node asked, per level, over every forest
    job on one of its data sets (the module docstring)."""

    def __init__(self, private_dir: Path, dataset: str) -> None:
        self.path = Path(private_dir) / LEDGER_FILE
        self.dataset = dataset

    def check(self, party: str, rule: str, n_features: int, depth: int,
              asked: list[int]) -> None:
        """Add one request's nodes (features asked per node) to the level's sums, or refuse
        (``ProtocolError``, logged, nothing written) beyond what honest draws sum."""
        if not asked:
            return
        with open(self.path.with_suffix(".lock"), "a") as lock:  # jobs of one party at once
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = self._load()
            levels = kept.setdefault(self.dataset, {})
            nodes, features, allowance = levels.get(str(depth), (0, 0, 0.0))
            mean = mean_features_bound(rule, n_features)
            nodes, features = nodes + len(asked), features + sum(asked)
            allowance = allowance + mean * len(asked)
            _refuse_beyond(party, rule, n_features, depth, asked, nodes, features, mean,
                           allowance + n_features + SLACK_SDS * math.sqrt(allowance),
                           " over every forest job on this data set")
            levels[str(depth)] = (nodes, features, allowance)
            with open_private(self.path, "w") as out:
                json.dump(kept, out)

    def _load(self) -> dict[str, dict[str, tuple[int, int, float]]]:
        if not self.path.exists():
            return {}
        try:
            kept = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise ProtocolError(f"the forest feature ledger {self.path} cannot be read ({exc}): "
                                f"refused, rather than start its sums afresh") from None
        return kept if isinstance(kept, dict) else {}


def _refuse_beyond(party: str, rule: str, n_features: int, depth: int, asked: list[int],
                   nodes: int, features: int, mean: float, allowed: float, where: str) -> None:
    if features > allowed:
        message = (f"{party}: refused histograms of {sum(asked)} features for {len(asked)} "
                   f"nodes at level {depth}: with them the job's trees ask {features} of this "
                   f"party's features for {nodes} nodes of that level{where}, more than honest "
                   f"max_features={rule} draws sum ({mean:.2f} per node of its {n_features} "
                   f"features, at most {int(allowed)})")
        log.warning("%s", message)
        raise ProtocolError(message)
