"""Horizontal federated GBDT as a Prefect flow (FedTree, horizontal setting; seed 001).

Members hold different rows with the same columns and the label; the aggregator holds no data.
After the members agree on shared cuts (mergeable quantile summaries), each tree follows
FedTree's four steps:

1. send tree: the members compute g and h under the model so far and agree on a common scale;
2. update histograms: per depth, each member builds its histograms and masks them;
3. secure sum: the aggregator adds the masked vectors (pairwise masks cancel in the sum);
4. grow: the aggregator chooses the splits, the members route their rows through them;

and finally the aggregator sends the leaves, which every member applies (step 1 of the next
tree). A member that does not answer within ``transport.step_timeout`` is dropped: the tree
restarts with the others under fresh masks, and the job fails below ``min_members``.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows import run_charts
from flows._tasks import (JobStopped, PartyError, StepTimeout, close_job,
                          combine_member_metrics, link, record_tree, step_id,
                          train_with_recoveries)
from flows.config import HorizontalJobConfig
from messages.bodies import Checkpoint, PartyInfo, ResumeJob, Step, TreeFinished
from messages.envelope import MsgType
from messages.horizontal import HorizontalSpec, OpenHorizontal, Round

SUMMARY_POINTS_PER_BIN = 32
"""A member's quantile summary has this many points per bin (at least 256 in all)."""


def horizontal_spec(config: HorizontalJobConfig) -> HorizontalSpec:
    """What every party is told about the job (no paths, no data)."""
    p, privacy = config.params, config.privacy
    return HorizontalSpec(
        parties=[PartyInfo(name, party.role, party.dataset or "")
                 for name, party in config.parties.items()],
        n_trees=p.n_trees, max_depth=p.max_depth, learning_rate=p.learning_rate,
        max_bin=p.max_bin, objective=p.objective, reg_lambda=p.reg_lambda, gamma=p.gamma,
        min_child_weight=p.min_child_weight, min_samples_leaf=p.min_samples_leaf,
        subsample=p.subsample, seed=p.seed, min_members=config.min_members,
        summary_size=summary_size(p.max_bin),
        dp_epsilon=privacy.epsilon if privacy else 0.0, dp_clip=privacy.clip if privacy else 0.0,
        dp_seed=privacy.seed if privacy and privacy.seed is not None else -1)


def summary_size(max_bin: int) -> int:
    """Points per feature in a member's summary."""
    return max(256, SUMMARY_POINTS_PER_BIN * max_bin)


def _step(kind: MsgType, tree: int = -1, depth: int = -1, attempt: int = 0) -> str:
    """A step's task id: a tree grown again after a dropout is a new attempt."""
    return f"{step_id(kind, tree, depth)}/a{attempt}"


@task(name="open_job", task_run_name="open-job", cache_policy=NO_CACHE)
def open_job(job: str, parties: list[str], spec: HorizontalSpec) -> dict[str, Any]:
    """Members load their data sets and exchange mask keys; every party reports its
    checkpoints of this job."""
    coord = link(job)
    coord.begin_session()
    return coord.call(parties, MsgType.H_OPEN_JOB, OpenHorizontal(spec),
                      _step(MsgType.H_OPEN_JOB))


@task(name="resume_job", task_run_name="resume-after-{trees_done}-trees", cache_policy=NO_CACHE)
def resume_job(job: str, parties: list[str], trees_done: int,
               shared: Checkpoint) -> dict[str, Any]:
    """Every party goes back to the checkpoint they all hold."""
    return link(job).call(parties, MsgType.RESUME_JOB, ResumeJob(shared),
                          _step(MsgType.RESUME_JOB, trees_done))


@task(name="agree_bins", task_run_name="agree-bins", cache_policy=NO_CACHE)
def agree_bins(job: str, aggregator: str, members: list[str]) -> int:
    """Shared cuts without pooling rows: members send quantile summaries (and their masked
    label sums), the aggregator merges them, every member bins its rows. Returns all rows."""
    coord = link(job)
    coord.call(members, MsgType.H_SUMMARIZE, Round(), _step(MsgType.H_SUMMARIZE))
    coord.call([aggregator], MsgType.H_MERGE_BINS, Round(), _step(MsgType.H_MERGE_BINS))
    replies = coord.call(members, MsgType.H_APPLY_BINS, Round(), _step(MsgType.H_APPLY_BINS))
    return sum(reply.count for reply in replies.values())


@task(name="send_tree", task_run_name="send-tree-t{tree}-a{attempt}", cache_policy=NO_CACHE)
def start_tree(job: str, aggregator: str, members: list[str], tree: int, attempt: int) -> None:
    """Step 1: members compute g and h under the model so far (the last tree applied) and
    agree with the aggregator on one quantization scale."""
    coord = link(job)
    round_ = Round(tree, -1, attempt, members)
    coord.call(members, MsgType.H_COMPUTE_GRADIENTS, round_,
               _step(MsgType.H_COMPUTE_GRADIENTS, tree, -1, attempt))
    coord.call([aggregator], MsgType.H_AGREE_SCALE, round_,
               _step(MsgType.H_AGREE_SCALE, tree, -1, attempt))


@task(name="update_histograms", task_run_name="update-histograms-t{tree}-d{depth}-a{attempt}",
      cache_policy=NO_CACHE)
def update_histograms(job: str, members: list[str], tree: int, depth: int, attempt: int) -> None:
    """Step 2: every member builds its histograms of the level's nodes and masks them."""
    link(job).call(members, MsgType.H_UPDATE_HISTOGRAMS, Round(tree, depth, attempt, members),
                   _step(MsgType.H_UPDATE_HISTOGRAMS, tree, depth, attempt))


@task(name="secure_sum", task_run_name="secure-sum-t{tree}-d{depth}-a{attempt}",
      cache_policy=NO_CACHE)
def secure_sum(job: str, aggregator: str, members: list[str], tree: int, depth: int,
               attempt: int) -> int:
    """Steps 3-4: the aggregator sums the masked histograms and chooses the splits; returns
    the nodes left open."""
    reply = link(job).call([aggregator], MsgType.H_SECURE_SUM,
                           Round(tree, depth, attempt, members),
                           _step(MsgType.H_SECURE_SUM, tree, depth, attempt))[aggregator]
    count: int = reply.count
    return count


@task(name="grow", task_run_name="grow-t{tree}-d{depth}-a{attempt}", cache_policy=NO_CACHE)
def grow(job: str, members: list[str], tree: int, depth: int, attempt: int) -> None:
    """Step 4 at the members: route their rows through the chosen splits."""
    link(job).call(members, MsgType.H_APPLY_SPLITS, Round(tree, depth, attempt, members),
                   _step(MsgType.H_APPLY_SPLITS, tree, depth, attempt))


@task(name="finish_tree", task_run_name="finish-tree-t{tree}-a{attempt}", cache_policy=NO_CACHE)
def finish_tree(job: str, aggregator: str, members: list[str], tree: int,
                attempt: int) -> dict[str, TreeFinished]:
    """The aggregator sends the leaf values; every member applies the tree and checkpoints.
    Returns each member's metrics over its own rows."""
    coord = link(job)
    round_ = Round(tree, -1, attempt, members)
    coord.call([aggregator], MsgType.H_SEND_TREE, round_,
               _step(MsgType.H_SEND_TREE, tree, -1, attempt))
    return coord.call(members, MsgType.H_RECEIVE_TREE, round_,
                      _step(MsgType.H_RECEIVE_TREE, tree, -1, attempt))


@task(name="save_models", task_run_name="save-models", cache_policy=NO_CACHE)
def save_models(job: str, parties: list[str]) -> None:
    """Every member writes the whole model."""
    link(job).call(parties, MsgType.SAVE_MODEL, Step(), step_id(MsgType.SAVE_MODEL))


class MembersLost(JobStopped):
    """Too few members remain after dropouts."""


@flow(name="horizontal", flow_run_name="{config.job}")
def horizontal(config: HorizontalJobConfig) -> dict[str, Any]:
    """Train a GBDT between members holding different rows of the same columns.

    ``config`` is the job file's content (a deployment's parameter). Running the same job
    again continues after the last tree every party checkpointed.
    """
    return train_with_recoveries(config, _train)


def _train(config: HorizontalJobConfig, progress: Any) -> dict[str, Any]:
    logger = get_run_logger()
    job, aggregator, members = config.job, config.aggregator, config.members
    started = time.perf_counter()
    opened = open_job(job, [aggregator, *members], horizontal_spec(config))
    rows = sum(reply.rows for reply in opened.values())
    shared = set.intersection(*(set(reply.checkpoints) for reply in opened.values()))
    history: list[dict[str, Any]] = []
    done = 0
    if shared:
        newest = max(shared, key=lambda c: c.trees_done)
        resumed = resume_job(job, [aggregator, *members], newest.trees_done, newest)
        done = newest.trees_done
        history = [combine_member_metrics({m: resumed[m].history[k] for m in members}) for k in range(done)]
        logger.info("resumed after %d trees from every party's checkpoint", done)
    else:
        agree_bins(job, aggregator, members)
    logger.info("%d members, %d rows in all; aggregator %s", len(members), rows, aggregator)
    live, dropped, attempt = list(members), [], 0
    tree_seconds: list[float | None] = [None] * done
    for tree in range(done, config.params.n_trees):
        tree_start = time.perf_counter()
        while True:
            try:
                _grow_tree(job, aggregator, live, tree, attempt, config.params.max_depth)
                break
            except StepTimeout as exc:
                live, attempt = _drop(config, live, dropped, exc, tree, attempt, logger)
        try:
            replies = finish_tree(job, aggregator, live, tree, attempt)
        except StepTimeout as exc:  # the tree is complete: the silent members leave after it
            live, attempt = _drop(config, live, dropped, exc, tree, attempt, logger, restart=False)
            replies = {}
        metrics = combine_member_metrics({m: r for m, r in replies.items() if m in live})
        history.append(metrics)
        tree_seconds.append(time.perf_counter() - tree_start)
        record_tree(job, progress, tree + 1, config.params.n_trees, tree_seconds[-1], metrics)
        shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        logger.info("tree %d/%d done in %.2f s: %s", tree + 1, config.params.n_trees,
                    tree_seconds[-1], shown)
    save_models(job, [aggregator, *live])
    try:
        close_job(job, [aggregator, *live])
    except PartyError as exc:
        if not exc.reply.state_lost:
            raise
        logger.warning("%s; its model is saved, nothing left to close", exc)
    last = history[-1] if history else {}
    result: dict[str, Any] = {
        "n_aligned": rows, "n_train": rows, "n_valid": 0, "n_trees": config.params.n_trees,
        **{k: v for k, v in last.items() if k != "members"},
        "resumed_after": done, "trees_trained": config.params.n_trees - done,
        "train_seconds": time.perf_counter() - started, "tree_seconds": tree_seconds,
        "history": history, "protocol": "horizontal", "members": members,
        "dropped": dropped, "member_metrics": last.get("members", {}),
        "step_seconds": dict(link(job).step_seconds)}
    if config.privacy is not None:  # every tree spends epsilon / n_trees (privacy.PrivacyBudget)
        result["epsilon"] = config.privacy.epsilon
        result["epsilon_spent"] = config.privacy.epsilon * len(history) / config.params.n_trees
    create_table_artifact(
        [{"tree": k + 1, "seconds": None if sec is None else round(sec, 3),
          **{key: value for key, value in m.items() if key != "members"}}
         for k, (sec, m) in enumerate(zip(tree_seconds, history, strict=True))],
        description=f"{job}: metrics per tree (row-weighted over members)"
                    + (f"; dropped {', '.join(dropped)}" if dropped else ""))
    run_charts.publish(job, result)
    return result


def _grow_tree(job: str, aggregator: str, live: list[str], tree: int, attempt: int,
               max_depth: int) -> None:
    """FedTree's steps 1-4 for one tree, level by level."""
    start_tree(job, aggregator, live, tree, attempt)
    for depth in range(max_depth):
        update_histograms(job, live, tree, depth, attempt)
        open_nodes = secure_sum(job, aggregator, live, tree, depth, attempt)
        grow(job, live, tree, depth, attempt)
        if open_nodes == 0:
            break


def _drop(config: HorizontalJobConfig, live: list[str], dropped: list[str], exc: StepTimeout,
          tree: int, attempt: int, logger: Any, restart: bool = True) -> tuple[list[str], int]:
    """Drop the members that did not answer; the aggregator not answering ends the job."""
    silent = [m for m in exc.missing if m in live]
    if not silent:
        raise exc
    live = [m for m in live if m not in silent]
    dropped.extend(silent)
    if len(live) < config.min_members:
        raise MembersLost(f"job {config.job}: member(s) {', '.join(silent)} did not answer "
                          f"within {config.transport.step_timeout:.0f} s at tree {tree}; "
                          f"{len(live)} member(s) left, min_members is {config.min_members}")
    logger.warning("dropped member(s) %s at tree %d: no answer within %.0f s; %s", ", ".join(silent),
                   tree, config.transport.step_timeout,
                   f"tree {tree} restarts with {', '.join(live)} under fresh masks" if restart
                   else f"the tree is complete; {', '.join(live)} go on")
    return live, attempt + 1
