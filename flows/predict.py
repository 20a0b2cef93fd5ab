"""Federated prediction as a Prefect flow: align, then score every batch in one of two modes.

``path`` (SecureBoost's inference): one round per tree level, in which each passive party
answers only the decisions at its nodes on the rows' current paths. ``batched`` (seed 002,
Alg. 5): two rounds per batch, in which each passive party sends the decisions of *all* its
nodes for every row, so the active party learns every one of them.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.coordinator import Coordinator, align_entities, close_job, link, step_id
from messages.bodies import PartyInfo, Step
from messages.secureboost import OpenPrediction
from messages.envelope import MsgType

PredictMode = Literal["path", "batched"]


@task(name="open_prediction", task_run_name="open-prediction", cache_policy=NO_CACHE)
def open_prediction(job: str, active: str, passives: list[str], batch_size: int,
                    scores_file: str, model_job: str,
                    datasets: dict[str, str] | None = None) -> None:
    """Every party loads its part of the trained job ``model_job`` and its own rows (the data
    set ``datasets`` names for it, else its default one)."""
    named = datasets or {}
    parties = ([PartyInfo(active, "active", named.get(active, ""))]
               + [PartyInfo(p, "passive", named.get(p, "")) for p in passives])
    link(job).call([active, *passives], MsgType.OPEN_PREDICTION,
                   OpenPrediction(parties=parties, batch_size=batch_size,
                                  scores_file=scores_file, model_job=model_job),
                   step_id(MsgType.OPEN_PREDICTION))


@task(name="evaluate_nodes", task_run_name="evaluate-nodes-b{batch}", cache_policy=NO_CACHE)
def evaluate_nodes(job: str, passives: list[str], batch: int) -> None:
    """Batched round 1: passive parties evaluate all their nodes on the batch."""
    link(job).call(passives, MsgType.EVALUATE_NODES, Step(batch),
                   step_id(MsgType.EVALUATE_NODES, batch))


@task(name="finish_traversal", task_run_name="finish-traversal-b{batch}", cache_policy=NO_CACHE)
def finish_traversal(job: str, active: str, batch: int) -> int:
    """Batched round 2: the active party walks the trees with everyone's decisions."""
    reply = link(job).call([active], MsgType.FINISH_TRAVERSAL, Step(batch),
                           step_id(MsgType.FINISH_TRAVERSAL, batch))[active]
    return int(reply.count)


def traverse_level_once(coord: Coordinator, active: str, passives: list[str], batch: int,
                        depth: int, walk: str = "") -> int:
    """One path-mode round: the active party asks each owner for the decisions on the rows'
    paths at level ``depth`` and moves the rows down; returns the (tree, row) pairs left at
    internal nodes. ``walk`` names one of several walks of a job (their steps are distinct
    commands, not replays)."""
    replies = coord.call([active, *passives], MsgType.TRAVERSE_LEVEL, Step(batch, depth),
                         step_id(MsgType.TRAVERSE_LEVEL, batch, depth) + walk)
    return int(replies[active].count)


@task(name="traverse_level", task_run_name="traverse-level-b{batch}-d{depth}",
      cache_policy=NO_CACHE)
def traverse_level(job: str, active: str, passives: list[str], batch: int, depth: int) -> int:
    """Path mode, one round per tree level (all trees, all rows of the batch)."""
    return traverse_level_once(link(job), active, passives, batch, depth)


@task(name="write_scores", task_run_name="write-scores", cache_policy=NO_CACHE)
def write_scores(job: str, active: str) -> int:
    """The active party writes the scores file in its model folder."""
    replies = link(job).call([active], MsgType.WRITE_SCORES, Step(), step_id(MsgType.WRITE_SCORES))
    return int(replies[active].count)


@flow(name="federated_predict", flow_run_name="{job}")
def federated_predict(job: str, active: str, passives: list[str], scores_file: str,
                      model_job: str, batch_size: int = 4096,
                      mode: PredictMode = "path",
                      datasets: dict[str, str] | None = None) -> dict[str, Any]:
    """Score the rows all parties share with the model trained by job ``model_job``."""
    logger = get_run_logger()
    started = time.perf_counter()
    open_prediction(job, active, passives, batch_size, scores_file, model_job, datasets)
    aligned = align_entities(job, active, passives)
    n_batches = -(-aligned.n_aligned // batch_size)
    rounds = 0
    for batch in range(n_batches):
        if mode == "batched":
            evaluate_nodes(job, passives, batch)
            finish_traversal(job, active, batch)
            rounds += 2
        else:
            depth = 0
            while traverse_level(job, active, passives, batch, depth) > 0:
                depth += 1
            rounds += depth + 1
        logger.info("batch %d/%d scored", batch + 1, n_batches)
    n_scored = write_scores(job, active)
    close_job(job, [active, *passives])
    return {"n_scored": n_scored, "n_batches": n_batches, "rounds": rounds, "mode": mode,
            "seconds": time.perf_counter() - started}
