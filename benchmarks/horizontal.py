"""The horizontal protocol on default_credit_homo: model quality under differential privacy, and
what secure aggregation's masks cost.

    python -m benchmarks.horizontal --dp [--seeds 0 1 2] [--epsilons 1 2 4 8 none]
        [--per-ensemble N] [--clip 0.3]
    python -m benchmarks.horizontal --cost [--rounds 3]
    common: [--trees 30] [--depth 3] [--lr 0.3] [--max-bin 32] [--data DIR] [--json FILE]

Every run is the embedded default: members guest, host_1 and host_2, each on its own file, and
an aggregator, in worker processes.

``--dp``: for each epsilon and seed (``params.seed`` = ``privacy.seed`` = the seed), ``fedboost
train`` of the job, then the test AUC of ``fedboost predict`` (guest's saved model) on
default_credit_homo_test.csv; prints mean, standard deviation and the per-seed AUCs, and
``--json FILE`` writes ``{"none": auc, "1": auc, ...}`` (FILE.detail.json: settings, per-seed
AUCs, ``epsilon_spent``). Its defaults are a private model's, tuned with ``benchmarks.dp_core
--valid`` on a holdout of the members' rows (DPBoost, docs/privacy.md): 50 trees in ensembles
of about epsilon 1 each (``ceil(50 / round(epsilon))`` trees: 50 at epsilon 1, 7 at 8), depth
3, learning rate (DPBoost's eta) 0.3, reg_lambda 100, 16 bins, gradients clipped to 0.3;
``none`` is the shipped config's non-private model (30 trees, lr 0.3, lambda 1, 32 bins).

``--cost``: the same job with and without masks, taking turns (``--rounds`` runs each). The
unmasked runs replace ``workers.horizontal.peers.mask_vector`` inside the worker processes by
the identity (the aggregator's ``unmask_sum`` of plain vectors is their plain sum), so nothing
else changes; the production code has no such switch. Prints seconds per tree of each, their
ratio (over all trees, and without the first, which also loads the histogram kernel), and
the members' seconds spent in ``mask_vector`` per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedboost import _prefect_env
from workers.model_folder import RunFolder

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MEMBERS = ("guest", "host_1", "host_2")
AGGREGATOR = "aggregator"


def job_config(data: Path, args: argparse.Namespace, *, seed: int = 0,
               epsilon: float | None = None) -> Any:
    """The default_credit_homo job with the command line's tree parameters."""
    from benchmarks.dp_core import trees_per_ensemble
    from flows.config import HorizontalJobConfig

    parties: dict[str, Any] = {
        m: {"role": "member", "data": str(data / f"default_credit_homo_{m}.csv"), "id": "id",
            "label": "y"} for m in MEMBERS}
    parties[AGGREGATOR] = {"role": "aggregator"}
    raw: dict[str, Any] = {
        "job": f"bench-homo-s{seed}", "protocol": "horizontal", "parties": parties,
        "params": {"n_trees": args.trees, "max_depth": args.depth,
                   "learning_rate": args.lr, "max_bin": args.max_bin, "objective": "binary",
                   "reg_lambda": args.reg_lambda, "seed": seed}}
    if epsilon is not None:
        raw["privacy"] = {"epsilon": epsilon, "clip": args.clip, "seed": seed,
                          "trees_per_ensemble": args.per_ensemble
                          or trees_per_ensemble(epsilon, args.trees)}
    return HorizontalJobConfig.model_validate(raw)


def test_auc(model_file: Path, test_file: Path) -> float:
    """AUC of a member's saved model on a test file (columns id, y, features)."""
    from boosting.metrics import auc
    from boosting.tree import load_model, raw_decider
    from workers.data import load_party_data
    from workers.row_partitioned import OWNER

    test = load_party_data("test", str(test_file), "id", "y", require_label=True)
    assert test.y is not None
    model = load_model(model_file)
    prob = model.predict(raw_decider({OWNER: test.x}), len(test.ids))
    return auc(test.y, prob[:, -1])


# --- --dp -----------------------------------------------------------------------------------

def predicted_auc(run: Path, test_file: Path) -> float:
    """AUC of ``fedboost predict RUN --data guest=TEST`` (guest scores with its saved model)."""
    from boosting.metrics import auc
    from fedboost.cli import main

    scores = run / "test-scores.csv"
    if main(["predict", str(run), "--data", f"guest={test_file}", "--out", str(scores)]) != 0:
        raise SystemExit(f"fedboost predict {run} failed")
    lines = scores.read_text().splitlines()
    header = lines[0].split(",")
    rows = [line.split(",") for line in lines[1:]]
    labels = dict(line.split(",")[:2] for line in test_file.read_text().splitlines()[1:])
    score = header.index(header[-1])
    return auc(np.array([float(labels[r[0]]) for r in rows]),
               np.array([float(r[score]) for r in rows]))


def dp_table(args: argparse.Namespace) -> dict[str, Any]:
    """Test AUC per epsilon (mean over seeds): each run ``fedboost train``, then ``fedboost
    predict`` on default_credit_homo_test.csv; ``none`` is the shipped config's non-private
    model (30 trees, lr 0.3, lambda 1, 32 bins)."""
    import yaml

    from fedboost.cli import main

    rows = []
    for epsilon in args.epsilons:
        aucs, spent = [], []
        for seed in args.seeds:
            raw = job_config(args.data, args, seed=seed, epsilon=epsilon).model_dump(
                mode="json", exclude_none=True)
            if epsilon is None:
                raw["params"].update(n_trees=30, learning_rate=0.3, reg_lambda=1.0, max_bin=32)
            with tempfile.TemporaryDirectory(prefix="bench-dp-") as out:
                started = time.perf_counter()
                (Path(out) / "job.yaml").write_text(yaml.safe_dump(raw))
                if main(["train", str(Path(out) / "job.yaml"), "--out",
                         str(Path(out) / "run")]) != 0:
                    raise SystemExit(f"fedboost train failed (epsilon {_eps(epsilon)})")
                metrics = json.loads(RunFolder(Path(out) / "run").metrics.read_text())
                spent.append(metrics.get("epsilon_spent"))
                aucs.append(predicted_auc(Path(out) / "run",
                                          args.data / "default_credit_homo_test.csv"))
            print(f"  epsilon {_eps(epsilon)} seed {seed}: test AUC {aucs[-1]:.4f}, "
                  f"epsilon_spent {spent[-1]} ({time.perf_counter() - started:.0f} s)",
                  flush=True)
        rows.append({"epsilon": epsilon, "mean_auc": statistics.mean(aucs),
                     "std_auc": statistics.stdev(aucs) if len(aucs) > 1 else 0.0,
                     "aucs": aucs, "epsilon_spent": spent,
                     "trees_per_ensemble": None if epsilon is None else
                     raw["privacy"]["trees_per_ensemble"]})
    per = args.per_ensemble or "ceil(trees / round(epsilon))"
    print(f"\ndefault_credit_homo, 3 members; private: {args.trees} trees in ensembles of "
          f"{per}, depth {args.depth}, lr {args.lr}, lambda "
          f"{args.reg_lambda}, max_bin {args.max_bin}, clip {args.clip}; test AUC of "
          f"fedboost predict on default_credit_homo_test.csv; none: the shipped config's "
          f"non-private model (30 trees, lr 0.3, lambda 1, 32 bins)")
    seeds = ", ".join(map(str, args.seeds))
    print(f"{'epsilon':>8} {'mean AUC':>9} {'std':>7}  per seed ({seeds})")
    for row in rows:
        print(f"{_eps(row['epsilon']):>8} {row['mean_auc']:>9.4f} {row['std_auc']:>7.4f}  "
              + "  ".join(f"{a:.4f}" for a in row["aucs"]))
    return {_eps(row["epsilon"]): row["mean_auc"] for row in rows} | {"rows": rows}


def _eps(epsilon: float | None) -> str:
    return "none" if epsilon is None else f"{epsilon:g}"


def _epsilon(text: str) -> float | None:
    return None if text == "none" else float(text)


# --- --cost ---------------------------------------------------------------------------------

def _serve_measured(unmasked: bool, log: str, target: Callable[..., None],
                    args: tuple[Any, ...]) -> None:
    """A worker process's entry point: time every ``mask_vector`` call of the member (one line
    per call in ``log``), with the masks left out if ``unmasked``; then serve as usual."""
    import workers.horizontal.peers as peers

    real = peers.mask_vector

    def measured(values: Any, me: str, secrets: dict[str, bytes], round: Any) -> Any:  # noqa: A002
        start = time.perf_counter()
        masked = values.view(np.uint64).copy() if unmasked else real(values, me, secrets, round)
        with open(log, "a") as out:
            out.write(f"{round.purpose} {round.tree} {values.size} "
                      f"{time.perf_counter() - start:.6f}\n")
        return masked

    peers.mask_vector = measured
    target(*args)


class _MeasuredContext:
    """A multiprocessing context that starts every process through :func:`_serve_measured`."""

    def __init__(self, base: Any, unmasked: bool, log_dir: Path) -> None:
        self._base, self._unmasked, self._log_dir = base, unmasked, log_dir

    def Process(self, *, target: Callable[..., None], name: str,  # noqa: N802 - mp's name
                args: tuple[Any, ...]) -> Any:
        log = str(self._log_dir / f"{name}.masks")
        return self._base.Process(target=_serve_measured, name=name,
                                  args=(self._unmasked, log, target, args))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._base, attr)


def _measured_hub(names: list[str], unmasked: bool, log_dir: Path) -> Any:
    """A MemoryHub whose worker processes run :func:`_serve_measured` (spawned, as always)."""
    from messages.transport import MemoryHub

    hub = MemoryHub(names)
    hub.context = _MeasuredContext(hub.context, unmasked, log_dir)  # type: ignore[assignment]
    return hub


def _one_cost_run(args: argparse.Namespace, unmasked: bool) -> dict[str, Any]:
    from fedboost.embedded import FLOW_ENDPOINT, train_embedded

    config = job_config(args.data, args)
    with tempfile.TemporaryDirectory() as out:
        logs = Path(out) / "masks"
        logs.mkdir()
        hub = _measured_hub([*config.parties, FLOW_ENDPOINT], unmasked, logs)
        result = train_embedded(config, Path(out) / "model", hub=hub)
        calls = [line.split() for f in logs.glob("*.masks") for line in f.read_text().splitlines()]
    hist = [float(c[3]) for c in calls if c[0] == "hist"]
    per_tree = result["tree_seconds"]
    return {"seconds_per_tree": statistics.mean(per_tree),
            # the first tree also loads the cached histogram kernel in the fresh worker processes
            "seconds_per_later_tree": statistics.mean(per_tree[1:] or per_tree),
            "tree_seconds": per_tree,
            # members mask at the same time: one member's share is what a tree waits for
            "mask_seconds_per_tree": sum(hist) / len(MEMBERS) / args.trees,
            "mask_calls": len(hist),
            "mask_values_per_member_tree": sum(int(c[2]) for c in calls if c[0] == "hist")
            / len(MEMBERS) / args.trees}


def cost(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds per tree with and without masks, alternating."""
    runs: dict[str, list[dict[str, Any]]] = {"masked": [], "unmasked": []}
    for k in range(args.rounds):
        for kind in ("masked", "unmasked") if k % 2 == 0 else ("unmasked", "masked"):
            runs[kind].append(_one_cost_run(args, unmasked=kind == "unmasked"))
            r = runs[kind][-1]
            print(f"  round {k + 1} {kind:>8}: {r['seconds_per_tree']:.3f} s/tree, "
                  f"mask_vector {1000 * r['mask_seconds_per_tree']:.1f} ms/tree per member",
                  flush=True)

    def mean_of(key: str) -> dict[str, float]:
        return {kind: statistics.mean(r[key] for r in rs) for kind, rs in runs.items()}

    mean, later = mean_of("seconds_per_tree"), mean_of("seconds_per_later_tree")
    mask = mean_of("mask_seconds_per_tree")
    # other load on the machine comes in bursts that a median over all trees of all runs skips
    median = {kind: statistics.median(t for r in rs for t in r["tree_seconds"])
              for kind, rs in runs.items()}
    ratio, later_ratio = mean["masked"] / mean["unmasked"], later["masked"] / later["unmasked"]
    median_ratio = median["masked"] / median["unmasked"]
    print(f"\ndefault_credit_homo, 3 members, {args.trees} trees depth {args.depth} "
          f"max_bin {args.max_bin}; {args.rounds} runs each, alternating")
    print(f"{'':>10} {'s/tree':>8} {'best run':>9} {'after 1st':>10} {'median tree':>12} "
          f"{'mask_vector ms/tree/member':>27} {'values masked/tree/member':>26}")
    for kind, rs in runs.items():
        print(f"{kind:>10} {mean[kind]:>8.3f} {min(r['seconds_per_tree'] for r in rs):>9.3f} "
              f"{later[kind]:>10.3f} {median[kind]:>12.3f} {1000 * mask[kind]:>27.2f} "
              f"{rs[0]['mask_values_per_member_tree']:>26.0f}")
    print(f"masked / unmasked (goal <= 1.3x): {ratio:.3f}x mean, {later_ratio:.3f}x after the "
          f"first tree, {median_ratio:.3f}x median tree; mask_vector alone "
          f"{mask['masked'] / median['unmasked']:.1%} of an unmasked tree")
    return {"runs": runs, "seconds_per_tree": mean, "seconds_per_later_tree": later,
            "median_tree_seconds": median, "mask_seconds_per_tree": mask, "ratio": ratio,
            "ratio_after_first_tree": later_ratio, "ratio_median_tree": median_ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--dp", action="store_true", help="test AUC against epsilon")
    what.add_argument("--cost", action="store_true", help="seconds per tree, masks or not")
    parser.add_argument("--trees", type=int, help="default 30 (--dp: 50)")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--lr", type=float, help="default 0.3 (--dp: DPBoost's eta, also 0.3)")
    parser.add_argument("--max-bin", type=int, help="default 32 (--dp: 16)")
    parser.add_argument("--clip", type=float, default=0.3,
                        help="DP gradient bound g*: every gradient is clipped to it")
    parser.add_argument("--per-ensemble", type=int, default=0,
                        help="DP trees per ensemble (default: ensembles of about epsilon 1, "
                             "benchmarks.dp_core.trees_per_ensemble)")
    parser.add_argument("--reg-lambda", type=float,
                        help="L2 regularisation, default 1 (--dp: 100, which shrinks the leaves' "
                             "sensitivity clip / (1 + lambda))")
    parser.add_argument("--epsilons", type=_epsilon, nargs="+",
                        default=[1.0, 2.0, 4.0, 8.0, None])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()
    for key, usual, private in (("trees", 30, 50), ("lr", 0.3, 0.3), ("reg_lambda", 1.0, 100.0),
                                ("max_bin", 32, 16)):
        if getattr(args, key) is None:  # tuned with benchmarks.dp_core (docs/privacy.md)
            setattr(args, key, private if args.dp else usual)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # a line per task run otherwise
    _prefect_env.configure()
    report = dp_table(args) if args.dp else cost(args)
    if args.json:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                    if k != "json"}
        if args.dp:  # {"none": auc, "1": auc, ...}, the settings and per-seed rows beside
            args.json.with_suffix(".detail.json").write_text(json.dumps(
                {"settings": settings, **report}, indent=2,
                default=lambda v: None if v is None else str(v)))
            args.json.write_text(json.dumps({k: v for k, v in report.items() if k != "rows"},
                                            indent=2))
            return
        args.json.write_text(json.dumps({"settings": settings, **report}, indent=2,
                                        default=lambda v: None if v is None else str(v)))


if __name__ == "__main__":
    main()
