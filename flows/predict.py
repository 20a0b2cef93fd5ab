"""Federated prediction as a Prefect flow: align, then two rounds per batch (seed 002, Alg. 5)."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows._tasks import align_entities, close_job, link, step_id
from messages.bodies import OpenPrediction, PartyInfo, Step
from messages.envelope import MsgType


@task(name="open_prediction", task_run_name="open-prediction", cache_policy=NO_CACHE)
def open_prediction(job: str, active: str, passives: list[str], batch_size: int,
                    scores_path: str) -> None:
    """Every party loads its model part and its rows."""
    parties = [PartyInfo(active, "active")] + [PartyInfo(p, "passive") for p in passives]
    link(job).call([active, *passives], MsgType.OPEN_PREDICTION,
                   OpenPrediction(parties=parties, batch_size=batch_size, scores_path=scores_path),
                   step_id(MsgType.OPEN_PREDICTION))


@task(name="evaluate_nodes", task_run_name="evaluate-nodes-b{batch}", cache_policy=NO_CACHE)
def evaluate_nodes(job: str, passives: list[str], batch: int) -> None:
    """Round 1: passive parties evaluate all their nodes on the batch."""
    link(job).call(passives, MsgType.EVALUATE_NODES, Step(batch),
                   step_id(MsgType.EVALUATE_NODES, batch))


@task(name="finish_traversal", task_run_name="finish-traversal-b{batch}", cache_policy=NO_CACHE)
def finish_traversal(job: str, active: str, batch: int) -> int:
    """Round 2: the active party walks the trees with everyone's decisions."""
    reply = link(job).call([active], MsgType.FINISH_TRAVERSAL, Step(batch),
                           step_id(MsgType.FINISH_TRAVERSAL, batch))[active]
    return int(reply.count)


@task(name="write_scores", task_run_name="write-scores", cache_policy=NO_CACHE)
def write_scores(job: str, active: str) -> int:
    """The active party writes the scores file."""
    replies = link(job).call([active], MsgType.WRITE_SCORES, Step(), step_id(MsgType.WRITE_SCORES))
    return int(replies[active].count)


@flow(name="federated_predict", flow_run_name="{job}")
def federated_predict(job: str, active: str, passives: list[str], scores_path: str,
                      batch_size: int = 4096) -> dict[str, Any]:
    """Score the rows all parties share with a trained model."""
    logger = get_run_logger()
    started = time.perf_counter()
    open_prediction(job, active, passives, batch_size, scores_path)
    aligned = align_entities(job, active, passives)
    n_batches = -(-aligned.n_aligned // batch_size)
    for batch in range(n_batches):
        evaluate_nodes(job, passives, batch)
        finish_traversal(job, active, batch)
        logger.info("batch %d/%d scored", batch + 1, n_batches)
    n_scored = write_scores(job, active)
    close_job(job, [active, *passives])
    return {"n_scored": n_scored, "n_batches": n_batches,
            "seconds": time.perf_counter() - started}
