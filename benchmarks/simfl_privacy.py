"""The attacks of issue 23 on SimFL, on a recorded job: what a builder infers about another
member's labels from the gradient sums it receives, and what the aggregator infers about rows
from their hash values.

    python -m benchmarks.simfl_privacy --data adult [--trees 6] [--depth 8] [--lr 0.05]
    python -m benchmarks.simfl_privacy --data breast --trees 6 --depth 4 --lr 0.3
    common: [--seed 0] [--adult PATH] [--json FILE]

A job runs on the embedded default with every message recorded (``MemoryHub(record=True)``);
each attack uses only what its party received, and the members' files only to score it.

- **Exact labels** (builder). At tree 0 every margin is the base score ``p0``, so exact sums
  give ``k = H / (p0 (1 - p0))`` rows and ``k p0 - G`` positives per builder row; when these
  are integers and the positives are 0 or ``k``, the ``k`` labels are known. At a later tree a
  row alone under a handle has ``H = p (1 - p)`` and ``G = p - y``: ``p`` from ``H``, ``y``
  from ``G``, accepted when ``y`` is 0 or 1 and ``logit(p)`` is a margin the trees so far can
  give (enumerated: base score plus one leaf of each tree). Counted: rows whose label such a
  claim names correctly.
- **Best guesses** (builder). On builder rows with exactly one similar row of the sender, the
  Bayes guess of its label from the noisy ``G`` (the noise's scale is in the job's spec): from
  tree 0 alone (prior: the sender's positive share, which the base score and row counts give),
  and from the mean of ``p_t - G_t`` over every tree the builder grew (``p_t`` its own row's
  prediction, a similar row's margin; prior: that prediction). Each against the same prior's
  guess without the sums: the difference is what the sums tell.
- **Hash inversion** (aggregator). It receives keyed bucket ids, not hash values: without
  the members' secret they are taken as numbers (which they are not); the functions rebuilt
  from the job spec's ``lsh_seed`` and ``r``; each row estimated as the least-squares
  (minimum-norm) solution of ``a x = r (F + 1/2) - b``; per feature the correlation with the true column and the RMS error
  in units of the column's standard deviation; medians. ``hash_agreement``: the share of hash
  values the rebuilt functions reproduce from the true rows.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from messages.envelope import Envelope, Kind, MsgType, decode_envelope

TOLERANCE = 1e-6
"""How close to an integer (rows, positives, a label) a value must be to count as exact: exact
sums of float64 gradients are off by about 1e-12."""
MAX_MARGINS = 1 << 18
"""Margins enumerated per tree at most (later trees are skipped beyond this)."""


@dataclass(frozen=True, slots=True)
class Recording:
    """Every message of a job: (sender, recipient, envelope)."""

    messages: list[tuple[str, str, Envelope]]

    def bodies(self, kind: Kind, sender: str | None = None,
               recipient: str | None = None) -> list[Any]:
        return [env.body for s, r, env in self.messages if env.kind == kind
                and sender in (None, s) and recipient in (None, r)]


def record(config: Any, out: Path) -> tuple[Recording, dict[str, Any]]:
    """Run ``config`` on the embedded default with every message recorded."""
    from fedboost.embedded import FLOW_ENDPOINT, train_embedded
    from messages.transport import MemoryHub

    hub = MemoryHub([*config.parties, FLOW_ENDPOINT], record=True)
    result = train_embedded(config, out, hub=hub)
    return Recording([(s, r, decode_envelope(msgpack.unpackb(d)["envelope"]))
                      for s, r, d in hub.recorded()]), result


# --- the builder's view ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BuilderView:
    """What ``builder`` received about ``sender``'s rows, and the truth to score it."""

    base: float
    trees: dict[int, list[tuple[float, ...]]]
    """Per tree, its leaf values (every member receives every tree)."""
    sums: dict[int, tuple[np.ndarray, np.ndarray]]
    """Per tree the builder grew, the (G, H) it received, per builder row."""
    own_margins: dict[int, np.ndarray]
    """Per tree the builder grew, its own rows' margins before it."""
    label_sd: float
    """Standard deviation of the persistent noise on G (0 before noise existed)."""
    tree_sd: float
    """Standard deviation of the fresh noise on G."""
    rows_of: list[np.ndarray]
    """Truth: per builder row, the sender's labels of the rows most similar to it."""
    prior: float
    """The sender's share of positives."""


def builder_view(rec: Recording, builder: str, sender: str, builder_x: np.ndarray,
                 sender_y: np.ndarray) -> BuilderView:
    """Collect the builder's view from a recording (``builder_x``: its own rows, to compute
    its margins; ``sender_y``: the sender's labels, for the truth only)."""
    from boosting.tree import Tree, TreeNode, leaf_values, raw_decider

    spec = rec.bodies(MsgType.S_OPEN_JOB, recipient=builder)[0].spec
    base = rec.bodies(MsgType.S_SIMILAR, recipient=builder)[0].base_score
    to_sender = rec.bodies(MsgType.S_SIMILAR, recipient=sender)[0]
    order = np.frombuffer(rec.bodies(MsgType.S_ROW_HASHES, sender=builder)[0].handles, "<u8")
    similar = np.frombuffer(to_sender.handles[to_sender.members.index(builder)], "<u8")
    position = {int(h): k for k, h in enumerate(order)}
    rows_of: list[list[float]] = [[] for _ in order]
    for row, handle in enumerate(similar):
        rows_of[position[int(handle)]].append(float(sender_y[row]))
    shared = {t.tree: t for t in rec.bodies(MsgType.S_TREE)}
    trees, margins, margin = {}, {}, np.zeros(len(order))
    sums = {}
    for got in rec.bodies(MsgType.S_GRADIENTS, sender=sender, recipient=builder):
        g = np.frombuffer(got.g, "<f8")
        # h per row before the totals (12e5b35 and earlier); now unknown per row
        h = np.frombuffer(got.h, "<f8") if hasattr(got, "h") else np.full(g.size, np.nan)
        if hasattr(got, "handles"):  # wire version 2: sums for the similar rows only
            at = [position[int(x)] for x in np.frombuffer(got.handles, "<u8")]
            g, h = np.zeros(len(order)), np.zeros(len(order))
            g[at], h[at] = np.frombuffer(got.g, "<f8"), np.frombuffer(got.h, "<f8")
        sums[got.tree] = (g, h)
    for t in sorted(shared):
        if t in sums:
            margins[t] = base + margin.copy()
        nodes = shared[t].nodes
        trees[t] = [n.value for n in nodes if n.left == -1]
        tree = Tree(nodes=tuple(
            TreeNode(id=n.id, value=n.value) if n.left == -1 else
            TreeNode(id=n.id, left=n.left, right=n.right, owner="x", feature=n.feature,
                     threshold=n.threshold, missing_left=n.missing_left) for n in nodes),
            output=0)
        margin += leaf_values(tree, len(order), raw_decider({"x": builder_x}))
    clip = 1.0  # binary: the logistic loss's |g| < 1 is the noise's unit
    return BuilderView(base, trees, sums, margins, clip * getattr(spec, "noise_label", 0.0),
                       clip * getattr(spec, "noise_tree", 0.0),
                       [np.array(r) for r in rows_of], float(sender_y.mean()))


def _sigmoid(m: np.ndarray | float) -> Any:
    return 1.0 / (1.0 + np.exp(-np.asarray(m)))


def exact_labels(view: BuilderView) -> dict[str, Any]:
    """Rows whose label the exact-sum attack names (each counted once over all trees), how
    many of those it names right, and per tree the rows named right."""
    named: dict[int, bool] = {}  # builder row -> all its rows' labels named right
    per_tree = {}
    p0 = float(_sigmoid(view.base))
    for t, (g, h) in sorted(view.sums.items()):
        right = 0
        if t == 0:
            k = h / (p0 * (1 - p0))
            positives = k * p0 - g
            whole = (np.abs(k - np.round(k)) < TOLERANCE) & (np.round(k) >= 1) & \
                (np.abs(positives - np.round(positives)) < TOLERANCE)
            for j in map(int, np.flatnonzero(whole)):
                rows, pos = round(float(k[j])), round(float(positives[j]))
                if pos in (0, rows):
                    truth = view.rows_of[j]
                    named[j] = truth.size == rows and bool((truth == (pos > 0)).all())
                    right += rows * named[j]
        else:
            margins = _reachable_margins(view, t)
            for j in map(int, np.flatnonzero(h <= 0.25 + TOLERANCE)):
                label = _single_row_label(float(g[j]), float(h[j]), margins)
                if label is not None:
                    truth = view.rows_of[j]
                    named[j] = named.get(j, True) and truth.size == 1 and truth[0] == label
                    right += int(named[j])
        per_tree[t] = right
    claimed = sum(view.rows_of[j].size for j in named)
    correct = sum(view.rows_of[j].size for j, ok in named.items() if ok)
    return {"claimed": claimed, "correct": correct, "correct_per_tree": per_tree,
            "rows": int(sum(r.size for r in view.rows_of))}


def _reachable_margins(view: BuilderView, t: int) -> np.ndarray | None:
    """Every margin the trees before ``t`` can give a row, sorted (None: too many)."""
    margins = np.array([view.base])
    for s in range(t):
        leaves = np.unique(view.trees.get(s, [0.0]))
        if margins.size * leaves.size > MAX_MARGINS:
            return None
        margins = np.unique((margins[:, None] + leaves[None, :]).ravel())
    return margins


def _single_row_label(g: float, h: float, margins: np.ndarray | None) -> int | None:
    """The label of a row alone under a handle, if ``(g, h)`` are exactly one row's."""
    root = math.sqrt(max(1.0 - 4.0 * h, 0.0))
    for p in ((1 - root) / 2, (1 + root) / 2):
        if not 0 < p < 1:
            continue
        y = p - g
        if abs(y - round(y)) >= TOLERANCE or round(y) not in (0, 1):
            continue
        if margins is not None:
            m = math.log(p / (1 - p))
            at = int(np.searchsorted(margins, m))
            near = [margins[i] for i in (at - 1, at) if 0 <= i < margins.size]
            if not any(abs(m - x) < 1e-4 for x in near):
                continue
        return round(y)
    return None


def best_guesses(view: BuilderView) -> dict[str, Any]:
    """Accuracy of the Bayes guess of a label on builder rows with exactly one similar row,
    with the sums and without them (what the sums add is the difference).

    One tree: the guess from tree 0's ``G`` with the sender's positive share as prior, against
    that prior's guess alone. All trees: the guess from the mean of ``p_t - G_t`` with the
    builder's own row's predicted probability (its last model before its last tree) as prior,
    against that prior alone.
    """
    single = [j for j, r in enumerate(view.rows_of) if r.size == 1]
    truth = np.array([view.rows_of[j][0] for j in single])
    result: dict[str, Any] = {"single_rows": len(single)}
    if not single or not view.sums:
        return result
    p0 = float(_sigmoid(view.base))
    g0 = view.sums[min(view.sums)][0][single]
    one = _bayes(p0 - g0, _spread(view, 1), np.full(len(single), view.prior))
    trees = sorted(view.sums)
    deviations = np.mean([_sigmoid(view.own_margins[t][single]) - view.sums[t][0][single]
                          for t in trees], axis=0)
    model = np.clip(_sigmoid(view.own_margins[trees[-1]][single]), 1e-6, 1 - 1e-6)
    many = _bayes(deviations, _spread(view, len(trees)), model)
    result.update(
        trees=len(trees), prior_accuracy=float(np.mean(float(view.prior > 0.5) == truth)),
        one_tree_accuracy=float(np.mean(one == truth)),
        model_accuracy=float(np.mean((model > 0.5) == truth)),
        all_trees_accuracy=float(np.mean(many == truth)))
    result["one_tree_advantage"] = result["one_tree_accuracy"] - result["prior_accuracy"]
    result["all_trees_advantage"] = result["all_trees_accuracy"] - result["model_accuracy"]
    return result


def _spread(view: BuilderView, trees: int) -> float:
    """The noise on a mean over ``trees`` trees: fresh noise averages out, persistent does not."""
    return max(math.sqrt(view.label_sd ** 2 + view.tree_sd ** 2 / trees), 1e-3)


def _bayes(deviation: np.ndarray, spread: float, prior: np.ndarray) -> np.ndarray:
    """Label 1 when ``N(d; 1, s) prior > N(d; 0, s) (1 - prior)``."""
    log_odds = np.log(prior / (1 - prior)) + (deviation - 0.5) / spread ** 2
    return (log_odds > 0).astype(float)


# --- the aggregator's view ------------------------------------------------------------------

def received_values(sent: Any, secret: bytes | None = None, span: int = 1 << 12) -> np.ndarray:
    """A member's per-row values as the aggregator received them: int32 hash values (12e5b35 and
    before), or 64-bit bucket ids, read back into hash values when ``secret`` is
    given (by the ids of every window within ``span`` of 0) and taken as numbers otherwise."""
    rows = len(sent.handles) // 8
    if len(sent.hashes) == 4 * rows * sent.functions:
        return np.frombuffer(sent.hashes, "<i4").reshape(rows, sent.functions).astype(float)
    ids = np.frombuffer(sent.hashes, "<u8").reshape(rows, sent.functions)
    if secret is None:
        return ids.astype(float)
    from workers.simfl.lsh import bucket_ids

    windows = np.arange(-span, span, dtype=np.int64)
    table = bucket_ids(np.repeat(windows[:, None], sent.functions, axis=1), secret)
    values = np.full(ids.shape, np.nan)
    for k in range(sent.functions):
        known = dict(zip(table[:, k].tolist(), windows.tolist()))
        values[:, k] = [known.get(v, np.nan) for v in ids[:, k].tolist()]
    return values


def invert_hashes(rec: Recording, aggregator: str, member: str, x: np.ndarray,
                  functions: Any = None, secret: bytes | None = None) -> dict[str, float]:
    """Least-squares inversion of ``member``'s hash values with the functions the aggregator
    rebuilds from the job spec (or with ``functions`` and the members' ``secret``, which reads
    the bucket ids back, to show the attack works with the right ones); the median and largest
    correlation per feature with the true columns ``x``."""
    from workers.simfl.lsh import DEFAULT_R, LshFunctions, default_functions

    spec = rec.bodies(MsgType.S_OPEN_JOB, recipient=aggregator)[0].spec
    sent = rec.bodies(MsgType.S_ROW_HASHES, sender=member, recipient=aggregator)[0]
    values = np.nan_to_num(received_values(sent, secret))
    d = len(sent.columns)
    if functions is None:
        functions = LshFunctions.from_seed(spec.lsh_seed, d,
                                           spec.lsh_functions or default_functions(d),
                                           spec.lsh_r or DEFAULT_R)
    rhs = functions.r * (values + 0.5) - functions.b
    estimate = rhs @ np.linalg.pinv(functions.a).T
    correlations, errors = [], []
    for f in range(d):
        column, guess = np.nan_to_num(x[:, f]), estimate[:, f]
        if column.std() > 0 and guess.std() > 0:
            correlations.append(float(np.corrcoef(column, guess)[0, 1]))
            errors.append(float(np.sqrt(np.mean((guess - column) ** 2)) / column.std()))
    with np.errstate(invalid="ignore"):
        same = float(np.mean(functions.hash(np.nan_to_num(x)) == values))
    return {"median_correlation": float(np.median(correlations)),
            "max_correlation": float(np.max(correlations)),
            "median_error": float(np.median(errors)), "hash_agreement": same}


# --- a run ----------------------------------------------------------------------------------

def attack_job(config: Any, data: dict[str, Path], out: Path) -> dict[str, Any]:
    """Record ``config`` and run every attack: per (builder, sender) pair and per member's
    hash values."""
    from workers.data import load_party_data

    rec, result = record(config, out)
    members = [m for m, p in config.parties.items() if p.role == "member"]
    aggregator = next(m for m, p in config.parties.items() if p.role == "aggregator")
    rows = {m: load_party_data(m, data[m], "id", "y", require_label=True) for m in members}
    report: dict[str, Any] = {"builders": {}, "aggregator": {}, "privacy": result.get("privacy")}
    for builder in members:
        for sender in members:
            if sender != builder:
                labels = rows[sender].y
                assert labels is not None  # members' files carry labels (require_label)
                view = builder_view(rec, builder, sender, rows[builder].x, labels)
                report["builders"][f"{builder}<-{sender}"] = {
                    **exact_labels(view), **best_guesses(view)}
    for member in members:
        report["aggregator"][member] = invert_hashes(rec, aggregator, member, rows[member].x)
    return report


def simfl_job(dataset: str, folder: Path, *, trees: int, depth: int, lr: float, seed: int = 0,
              adult: Path | None = None) -> tuple[Any, dict[str, Path]]:
    """A SimFL job on breast_homo's two hospitals, or on Adult's unbalanced two members
    (theta 0.8, written into ``folder``), and each member's file."""
    from benchmarks.simfl import federation
    from benchmarks.simfl_data import ADULT, write_member_files
    from flows.config import SimflJobConfig

    adult = adult or ADULT
    if dataset == "adult":
        fed = federation("unbalanced", 0.8, 2, 0, adult)
        files = write_member_files(folder / "data", fed.names, fed.x_train, fed.y_train,
                                   list(fed.parts.values()), (fed.x_test, fed.y_test),
                                   ids=fed.ids, test_ids=fed.test_ids)
        data = {m: files[m] for m in fed.parts}
    else:
        data = {m: adult.parent / f"breast_homo_{m}.csv" for m in ("guest", "host")}
    parties: dict[str, Any] = {m: {"role": "member", "data": str(f), "id": "id", "label": "y"}
                               for m, f in data.items()}
    parties["aggregator"] = {"role": "aggregator"}
    config = SimflJobConfig.model_validate({
        "job": f"simfl-attack-{dataset}", "protocol": "simfl", "parties": parties,
        "params": {"n_trees": trees, "max_depth": depth, "learning_rate": lr, "max_bin": 32,
                   "objective": "binary", "seed": seed, "lsh": {"seed": seed}},
        "transport": {"kind": "memory"}})
    return config, data


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    from benchmarks.simfl_data import ADULT

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=("adult", "breast"), default="adult")
    parser.add_argument("--trees", type=int, default=6)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--adult", type=Path, default=ADULT,
                        help="adult.csv.gz (breast_homo's files are beside it)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        config, data = simfl_job(args.data, Path(scratch), trees=args.trees, depth=args.depth,
                                 lr=args.lr, seed=args.seed, adult=args.adult)
        report = attack_job(config, data, Path(scratch) / "run")
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
