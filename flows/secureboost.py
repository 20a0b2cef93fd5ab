"""Vertical SecureBoost as a Prefect flow (SecureBoost Alg. 1-2; Completely SecureBoost, sec. 6).

The flow body is the algorithm's loop: align entities, bin features, then per tree encrypt
gradients and, per depth, build encrypted histograms -> find best splits -> apply splits ->
broadcast nodes; finally finish the tree. Each task is one command to the parties and returns
only counts, owners and metrics.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture

from flows import run_charts
from flows.coordinator import (PartyError, Sent, align_entities, close_job, link, record_tree,
                               step_id, train_with_recoveries)
from flows.declared.secureboost import JobConfig
from flows.job_schema import PrivacyConfig
from flows.early_stopping import EarlyStopping
from flows.predict import traverse_level_once
from messages.bodies import (Ack, Aligned, Checkpoint, PartyInfo, ResumeJob, Resumed, Step,
                             TreeFinished)
from messages.secureboost import VALIDATION_BATCH, JobSpec, OpenJob, SplitsFound
from messages.envelope import MsgType

def job_spec(config: JobConfig) -> JobSpec:
    """What every party is told about the job (no paths, no data)."""
    p = config.params
    return JobSpec(
        parties=[PartyInfo(name, party.role, party.dataset or "")
                 for name, party in config.parties.items()],
        params=p.tree_params(), complete_secure=p.complete_secure,
        key_bits=config.crypto.key_bits, valid_fraction=config.validation.fraction,
        valid_seed=config.validation.seed, label=config.parties[config.active].label or "",
        pack_bin_sums=config.crypto.pack_bin_sums, scheme=config.crypto.scheme,
        **privacy_fields(config.privacy))


def privacy_fields(privacy: PrivacyConfig | None) -> dict[str, Any]:
    """The spec's differential-privacy fields (none: zeros, the lossless protocol)."""
    if privacy is None:
        return {}
    return {"dp_epsilon": privacy.epsilon, "dp_clip": privacy.clip,
            "dp_seed": -1 if privacy.seed is None else privacy.seed,
            "dp_per_ensemble": privacy.trees_per_ensemble or 0}


@task(name="open_job", task_run_name="open-job", cache_policy=NO_CACHE)
def open_job(job: str, parties: list[str], spec: JobSpec) -> dict[str, list[Checkpoint]]:
    """Every party loads its own data (the active party makes a key pair) and reports the
    checkpoints it holds for this job; a new session makes messages of earlier ones stale."""
    coord = link(job)
    coord.begin_session()
    replies = coord.call(parties, MsgType.OPEN_JOB, OpenJob(spec), step_id(MsgType.OPEN_JOB))
    return {party: reply.checkpoints for party, reply in replies.items()}


@task(name="resume_job", task_run_name="resume-after-{trees_done}-trees", cache_policy=NO_CACHE)
def resume_job(job: str, active: str, passives: list[str], trees_done: int,
               shared: Checkpoint) -> Resumed:
    """Every party restores the checkpoint they all hold (alignment, bins, keys, trees)."""
    replies = link(job).call([active, *passives], MsgType.RESUME_JOB, ResumeJob(shared),
                             step_id(MsgType.RESUME_JOB, trees_done))
    resumed: Resumed = replies[active]
    rows = {(r.n_aligned, r.n_train, r.n_valid) for r in replies.values()}
    if len(rows) != 1:
        raise RuntimeError(f"job {job}: the parties' checkpoints disagree on the aligned rows "
                           f"{sorted(rows)}; start the job afresh under a new name")
    return resumed


@task(name="bin_features", task_run_name="bin-features", cache_policy=NO_CACHE)
def bin_features(job: str, active: str, passives: list[str]) -> int:
    """Every party bins its features locally; returns trees per round (classes or 1)."""
    replies = link(job).call([active, *passives], MsgType.BIN_FEATURES, Step(),
                             step_id(MsgType.BIN_FEATURES))
    outputs: int = replies[active].count
    return outputs


@task(name="encrypt_gradients", task_run_name="encrypt-gradients-t{tree}", cache_policy=NO_CACHE)
def encrypt_gradients(job: str, active: str, tree: int) -> int:
    """Alg. 1 l.1-3: the active party computes, encrypts and sends g and h."""
    reply: Ack = link(job).call([active], MsgType.ENCRYPT_GRADIENTS, Step(tree),
                                step_id(MsgType.ENCRYPT_GRADIENTS, tree))[active]
    return reply.count


@task(name="build_encrypted_histograms", task_run_name="build-histograms-t{tree}-d{depth}",
      cache_policy=NO_CACHE)
def build_encrypted_histograms(job: str, passives: list[str], tree: int, depth: int) -> None:
    """Alg. 1 l.4-9: every passive party, in parallel, sums ciphertexts per bin."""
    link(job).call(passives, MsgType.BUILD_HISTOGRAMS, Step(tree, depth),
                   step_id(MsgType.BUILD_HISTOGRAMS, tree, depth))


@task(name="find_best_splits", task_run_name="find-splits-t{tree}-d{depth}", cache_policy=NO_CACHE)
def find_best_splits(job: str, active: str, tree: int, depth: int) -> SplitsFound:
    """Alg. 2: the active party decrypts the histograms and picks each node's best split."""
    reply: SplitsFound = link(job).call([active], MsgType.FIND_BEST_SPLITS, Step(tree, depth),
                                        step_id(MsgType.FIND_BEST_SPLITS, tree, depth))[active]
    return reply


@task(name="apply_splits", task_run_name="apply-splits-t{tree}-d{depth}", cache_policy=NO_CACHE)
def apply_splits(job: str, owners: list[str], tree: int, depth: int) -> None:
    """Owners of the chosen splits record them and return the instance spaces; a party told
    to build ahead (``SplitsFound.ahead``) also sends the next level's histograms."""
    link(job).call(owners, MsgType.APPLY_SPLITS, Step(tree, depth),
                   step_id(MsgType.APPLY_SPLITS, tree, depth))


@task(name="broadcast_nodes", task_run_name="broadcast-nodes-t{tree}-d{depth}",
      cache_policy=NO_CACHE)
def broadcast_nodes(job: str, active: str, tree: int, depth: int, owners: list[str]) -> int:
    """The active party splits the nodes and tells every passive party; returns open nodes."""
    reply: Ack = link(job).call([active], MsgType.BROADCAST_NODES, Step(tree, depth, owners),
                                step_id(MsgType.BROADCAST_NODES, tree, depth))[active]
    return reply.count


@task(name="finish_tree", task_run_name="finish-tree-t{tree}", cache_policy=NO_CACHE)
def finish_tree(job: str, active: str, tree: int) -> dict[str, float]:
    """Leaf weights and training metrics at the active party, which checkpoints the tree."""
    replies = link(job).call([active], MsgType.FINISH_TREE, Step(tree),
                             step_id(MsgType.FINISH_TREE, tree))
    done: TreeFinished = replies[active]
    return {m.name: m.value for m in done.metrics}


@task(name="drop_tree", task_run_name="drop-tree-t{tree}", cache_policy=NO_CACHE)
def drop_tree(job: str, dropping: Sent, tree: int, progress: Any, n_trees: int,
              seconds: float, metrics: dict[str, float]) -> None:
    """Passive parties drop the tree's ciphertexts and checkpoint it; then the run's progress
    counts the tree (every party holds it). Sent before the next tree's gradients (on a slow
    link it would wait behind them: 13 s at 10 Mbit/s), then submitted, not waited for: its
    round trip runs beside those gradients (``_awaited`` before that tree's first histograms
    are asked for)."""
    link(job).collect(dropping)
    record_tree(job, progress, tree + 1, n_trees, seconds, metrics)


def _awaited(dropping: list[PrefectFuture[None]]) -> None:
    """The passive parties' drop of the previous tree done (its errors are raised here)."""
    while dropping:
        dropping.pop().result()


@task(name="evaluate_validation", task_run_name="evaluate-validation", cache_policy=NO_CACHE)
def evaluate_validation(job: str, active: str, passives: list[str], n_valid: int,
                        after: int = -1) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Score the hold-out rows federatedly in path mode (one round per tree level, only the
    decisions on each row's path) and compute metrics: of the model, and after each tree.
    Early stopping scores the model ``after`` each round; each walk covers only the trees
    added since the last one."""
    coord = link(job)
    walk = f"/after{after}" if after >= 0 else ""
    for batch in range(-(-n_valid // VALIDATION_BATCH)):
        depth = 0
        while traverse_level_once(coord, active, passives, batch, depth, walk) > 0:
            depth += 1
    done: TreeFinished = coord.call([active], MsgType.EVALUATE_VALIDATION, Step(),
                                    step_id(MsgType.EVALUATE_VALIDATION) + walk)[active]
    return ({m.name: m.value for m in done.metrics},
            [{m.name: m.value for m in tree} for tree in done.per_tree])


@task(name="save_models", task_run_name="save-models", cache_policy=NO_CACHE)
def save_models(job: str, parties: list[str], keep: int = -1) -> None:
    """Tree exchange: each party writes its own part (structure+leaves, or lookup table), of
    the first ``keep`` trees (early stopping) or all (-1)."""
    link(job).call(parties, MsgType.SAVE_MODEL, Step(keep), step_id(MsgType.SAVE_MODEL))


@flow(name="vertical_secureboost", flow_run_name="{config.job}")
def vertical_secureboost(config: JobConfig) -> dict[str, Any]:
    """Train a SecureBoost model between one active and several passive parties.

    ``config`` is the job file's content (a deployment's parameter). Over RabbitMQ the flow
    connects to the running party workers itself; the embedded default attaches its own.
    Running the same job again (``fedboost resume``, the same ``fedboost train``, Retry in the
    UI) continues after the last tree every party checkpointed; so does this run when a party's
    worker restarts mid-job.
    """
    return train_with_recoveries(config, _train)


def _train(config: JobConfig, progress: Any) -> dict[str, Any]:
    logger = get_run_logger()
    job, active, passives = config.job, config.active, config.passives
    params = config.params
    started = time.perf_counter()
    held = open_job(job, [active, *passives], job_spec(config))
    shared = set.intersection(*(set(points) for points in held.values()))
    history: list[dict[str, float]] = []
    if shared:
        newest = max(shared, key=lambda c: c.trees_done)
        resumed = resume_job(job, active, passives, newest.trees_done, newest)
        aligned = Aligned(resumed.n_aligned, resumed.n_train, resumed.n_valid)
        per_round, done = resumed.outputs, resumed.trees_done
        history = [{m.name: m.value for m in t.metrics} for t in resumed.history]
        logger.info("resumed after %d trees from every party's checkpoint", done)
    else:
        aligned = align_entities(job, active, passives)
        per_round, done = bin_features(job, active, passives), 0
    logger.info("aligned %d rows (%d train, %d validation)", aligned.n_aligned, aligned.n_train,
                aligned.n_valid)
    n_trees = params.n_trees * per_round
    stopper = (EarlyStopping(params.early_stopping_rounds, per_round)
               if params.early_stopping_rounds else None)
    tree_seconds: list[float | None] = [None] * done  # trained by an earlier run
    dropping: list[PrefectFuture[None]] = []  # the previous tree at the passive parties
    for tree in range(done, n_trees):
        tree_start = time.perf_counter()
        # Completely SecureBoost: the first round (one tree per class) stays with the active party
        members = [] if params.complete_secure and tree < per_round else passives
        encrypt_gradients(job, active, tree)
        _awaited(dropping)
        built_ahead: list[str] = []  # built the level as they applied the one above
        for depth in range(params.max_depth):
            if to_build := [m for m in members if m not in built_ahead]:
                build_encrypted_histograms(job, to_build, tree, depth)
            found = find_best_splits(job, active, tree, depth)
            if applying := [p for p in passives if p in found.owners or p in found.ahead]:
                apply_splits(job, applying, tree, depth)
            built_ahead = found.ahead
            if broadcast_nodes(job, active, tree, depth, found.owners) == 0:
                break
        metrics = finish_tree(job, active, tree)  # the passive parties' checkpoint follows
        seconds = time.perf_counter() - tree_start
        tree_seconds.append(seconds)
        history.append(metrics)
        # progress moves once every party holds the tree: "trees k/n" is a point to resume from
        sent = link(job).send(passives, MsgType.FINISH_TREE, Step(tree),
                              step_id(MsgType.FINISH_TREE, tree))
        dropping.append(drop_tree.submit(job, sent, tree, progress, n_trees, seconds, metrics))
        shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items())
        logger.info("tree %d done (%d/%d) in %.2f s: %s", tree, tree + 1, n_trees,
                    tree_seconds[-1], shown)
        if stopper is not None and (tree + 1) % per_round == 0:
            _awaited(dropping)  # before the passive parties score
            if stopper.after_round(*evaluate_validation(job, active, passives,
                                                        aligned.n_valid, tree + 1), tree + 1):
                logger.info("early stopping after %d trees: %s", tree + 1, stopper.says())
                break
    _awaited(dropping)
    trained = len(history)
    if config.privacy is not None:  # the budget spent by each tree, for the learning curve
        for k, entry in enumerate(history):
            entry["epsilon_spent"] = config.privacy.spent(k + 1, n_trees)
    final: dict[str, float] = {}
    if aligned.n_valid:
        final, per_tree = evaluate_validation(job, active, passives, aligned.n_valid)
        if stopper is not None and not stopper.scored(trained):  # resumed after the last tree
            stopper.after_round(final, per_tree, trained)
        if len(per_tree) == len(history):  # the learning curve on the hold-out rows
            history = [{**m, **valid} for m, valid in zip(history, per_tree, strict=True)]
    keep = stopper.kept_trees(trained) if stopper is not None else trained
    result: dict[str, Any] = {"n_aligned": aligned.n_aligned, "n_train": aligned.n_train,
                              "n_valid": aligned.n_valid, "n_trees": keep,
                              "trees_per_round": per_round,
                              **{k: v for k, v in history[keep - 1].items()
                                 if k != run_charts.LEAF_PURITY and not k.startswith("valid_")},
                              "resumed_after": done, "trees_trained": trained - done, **final}
    if stopper is not None:  # the kept model's metrics, and where it stopped
        result.update(stopper.summary())
    if config.privacy is not None:  # docs/privacy.md: each started ensemble its share
        result["epsilon"] = config.privacy.epsilon
        result["epsilon_spent"] = config.privacy.spent(trained, n_trees)
        result["trees_per_ensemble"] = config.privacy.per_ensemble(n_trees)
    save_models(job, [active, *passives], keep if stopper is not None else -1)
    try:
        close_job(job, [active, *passives])
    except PartyError as exc:
        if not exc.reply.state_lost:
            raise
        logger.warning("%s; its model part is saved, nothing left to close", exc)
    result.update(train_seconds=time.perf_counter() - started, tree_seconds=tree_seconds,
                  history=history, key_bits=config.crypto.key_bits,
                  step_seconds=dict(link(job).step_seconds))
    create_table_artifact(
        [{"tree": k + 1, "seconds": None if sec is None else round(sec, 3), **m}
         for k, (sec, m) in enumerate(zip(tree_seconds, history, strict=True))],
        description=f"{job}: metrics per tree; final "
                    + ", ".join(f"{k}={v:.4f}" for k, v in result.items()
                                if k.startswith(("train_", "valid_")) and isinstance(v, float)))
    run_charts.publish(job, result)
    return result
