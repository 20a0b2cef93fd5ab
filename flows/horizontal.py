"""Horizontal federated GBDT as a Prefect flow (FedTree, horizontal setting; seed 001).

Members hold different rows with the same columns and the label; the aggregator holds no data.
After the members agree on shared cuts (securely summed counts on a public grid), each tree
follows FedTree's four steps:

1. start tree (FedTree's "send tree"): the members compute g and h under the model so far and
   agree on a common scale;
2. update histograms: per depth, each member builds its histograms and masks them (the root's
   are also sealed, and the members release the seal's key once all are in);
3. secure sum: the aggregator adds the masked vectors (pairwise masks cancel in the sum);
4. grow: the aggregator chooses the splits, the members route their rows through them;

and finally the aggregator sends the leaves, which every member applies (step 1 of the next
tree). In multiclass a round grows one tree per class, each on the gradients the members
computed at the round's start (as the core and the vertical protocol do); every tree is one
pass of the steps above, under masks of its own. A member that does not answer within ``transport.step_timeout`` is dropped, and the
aggregator never gets two sums of one tree over different members: before the root's key went
out the tree restarts with the others (the first attempt's vectors stay sealed); after, the
tree stops where it stands (its open nodes become leaves) and the next tree goes on without
the member. The job fails below ``min_members``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.coordinator import JobStopped, StepTimeout, link, step_id
from flows.member_metrics import combine_member_metrics
from flows.declared.horizontal import HorizontalJobConfig
from flows.run import RunProtocol, Start, TrainingRun, train_run
from messages.bodies import Aligned, Checkpoint, PartyInfo, ResumeJob, Step, TreeFinished
from messages.envelope import Kind, MsgType
from messages.horizontal import HorizontalSpec, OpenHorizontal, Round

SUMMARY_POINTS_PER_BIN = 32
"""The set-up grid's resolution per bin: a quantile's cell is split while it holds more than
1 / (32 max_bin) of the rows (at least 1/256); the spec calls it ``summary_size``."""


def horizontal_spec(config: HorizontalJobConfig) -> HorizontalSpec:
    """What every party is told about the job (no paths, no data)."""
    p, privacy = config.params, config.privacy
    return HorizontalSpec(
        parties=[PartyInfo(name, party.role, party.dataset or "")
                 for name, party in config.parties.items()],
        params=p.tree_params(), min_members=config.min_members,
        summary_size=summary_size(p.max_bin),
        dp_epsilon=privacy.epsilon if privacy else 0.0, dp_clip=privacy.clip if privacy else 0.0,
        dp_seed=privacy.seed if privacy and privacy.seed is not None else -1,
        dp_per_ensemble=privacy.trees_per_ensemble or 0 if privacy else 0)


def summary_size(max_bin: int) -> int:
    """The set-up grid's resolution (``workers.horizontal.grid``)."""
    return max(256, SUMMARY_POINTS_PER_BIN * max_bin)


def _step(kind: Kind, tree: int = -1, depth: int = -1, attempt: int = 0) -> str:
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
def agree_bins(job: str, aggregator: str, members: list[str]) -> tuple[int, int]:
    """Shared cuts without pooling rows: round by round, members count their values in the
    cells of a public grid (masked, with their masked label sums in round 0), the aggregator
    sums the counts and splits the cells holding quantiles, then sends the cuts; every member
    bins its rows. Returns all rows and the trees per round (the classes, or 1)."""
    coord = link(job)
    round_, more = 0, 1
    while more:
        coord.call(members, MsgType.H_SUMMARIZE, Round(depth=round_),
                   _step(MsgType.H_SUMMARIZE, -1, round_))
        more = coord.call([aggregator], MsgType.H_MERGE_BINS, Round(depth=round_),
                          _step(MsgType.H_MERGE_BINS, -1, round_))[aggregator].count
        round_ += 1
    replies = coord.call([aggregator, *members], MsgType.H_APPLY_BINS, Round(),
                         _step(MsgType.H_APPLY_BINS))
    return sum(replies[m].count for m in members), replies[aggregator].count


@task(name="start_tree", task_run_name="start-tree-t{tree}-a{attempt}", cache_policy=NO_CACHE)
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
def update_histograms(job: str, members: list[str], tree: int, depth: int, attempt: int,
                      silent: list[str] | None = None) -> None:
    """Step 2: every member builds its histograms of the level's nodes and masks them (the
    root's also sealed); ``members`` is the tree's member set, ``silent`` those not asked."""
    link(job).call(_asked(members, silent), MsgType.H_UPDATE_HISTOGRAMS,
                   Round(tree, depth, attempt, members),
                   _step(MsgType.H_UPDATE_HISTOGRAMS, tree, depth, attempt))


@task(name="release_round", task_run_name="release-round-t{tree}-a{attempt}",
      cache_policy=NO_CACHE)
def release_round(job: str, members: list[str], tree: int, attempt: int) -> None:
    """Step 2's end at the root: every member's sealed histograms are in, so the members
    (any one of them suffices) send the aggregator the key of the seals."""
    link(job).call(members, MsgType.H_RELEASE_ROUND, Round(tree, 0, attempt, members),
                   _step(MsgType.H_RELEASE_ROUND, tree, 0, attempt))


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
def grow(job: str, members: list[str], tree: int, depth: int, attempt: int,
         silent: list[str] | None = None) -> None:
    """Step 4 at the members: route their rows through the chosen splits."""
    link(job).call(_asked(members, silent), MsgType.H_APPLY_SPLITS,
                   Round(tree, depth, attempt, members),
                   _step(MsgType.H_APPLY_SPLITS, tree, depth, attempt))


@task(name="finish_tree", task_run_name="finish-tree-t{tree}-a{attempt}", cache_policy=NO_CACHE)
def finish_tree(job: str, aggregator: str, members: list[str], tree: int, attempt: int,
                silent: list[str] | None = None) -> dict[str, TreeFinished]:
    """The aggregator sends the leaf values (of the tree as far as it grew); every member
    still answering applies the tree and checkpoints. Returns each one's metrics over its own
    rows."""
    coord = link(job)
    round_ = Round(tree, -1, attempt, members)
    coord.call([aggregator], MsgType.H_SEND_TREE, round_,
               _step(MsgType.H_SEND_TREE, tree, -1, attempt))
    return coord.call(_asked(members, silent), MsgType.H_RECEIVE_TREE, round_,
                      _step(MsgType.H_RECEIVE_TREE, tree, -1, attempt))


def _asked(members: list[str], silent: list[str] | None) -> list[str]:
    return [m for m in members if m not in (silent or [])]


@task(name="save_models", task_run_name="save-models", cache_policy=NO_CACHE)
def save_models(job: str, parties: list[str]) -> None:
    """Every member writes the whole model."""
    link(job).call(parties, MsgType.SAVE_MODEL, Step(), step_id(MsgType.SAVE_MODEL))


class MembersLost(JobStopped):
    """Too few members remain after dropouts."""


@dataclass(slots=True)
class Membership:
    """Who takes part in a flow run, across its recoveries: a dropped member stays dropped."""

    live: list[str]
    dropped: list[str] = field(default_factory=list)
    attempt: int = 0
    """Attempts so far (each tree grown again after a dropout is a new one)."""


class Regrow(Exception):
    """Members went silent before any sum of the tree was opened: grow it without them."""

    def __init__(self, silent: list[str]) -> None:
        super().__init__(", ".join(silent))
        self.silent = silent


@flow(name="horizontal", flow_run_name="{config.job}")
def horizontal(config: HorizontalJobConfig) -> dict[str, Any]:
    """Train a GBDT between members holding different rows of the same columns.

    ``config`` is the job file's content (a deployment's parameter). Running the same job
    again continues after the last tree every party checkpointed.
    """
    return train_run(config, Horizontal(config))


class Horizontal(RunProtocol):
    """FedTree's horizontal run: members' masked histograms, summed by the aggregator."""

    config: HorizontalJobConfig

    def __init__(self, config: HorizontalJobConfig) -> None:
        super().__init__(config, [config.aggregator, *config.members])
        self.aggregator = config.aggregator
        self.members = Membership(list(config.members))  # a dropped member stays dropped

    def open(self) -> Start:
        job, aggregator, members = self.job, self.aggregator, self.members
        self.parties = [aggregator, *members.live]
        opened = open_job(job, self.parties, horizontal_spec(self.config))
        rows = sum(reply.rows for reply in opened.values())
        shared = set.intersection(*(set(reply.checkpoints) for reply in opened.values()))
        get_run_logger().info("%d members, %d rows in all; aggregator %s", len(members.live),
                              rows, aggregator)
        if shared:
            newest = max(shared, key=lambda c: c.trees_done)
            resumed = resume_job(job, self.parties, newest.trees_done, newest)
            done = newest.trees_done
            return Start(Aligned(rows, rows, 0), resumed[aggregator].outputs, done,
                         [combine_member_metrics({m: resumed[m].history[k]
                                                  for m in members.live})
                          for k in range(done)])
        if members.dropped:  # a set-up without them would hand the aggregator their counts
            raise MembersLost(f"job {job}: no checkpoint left that {', '.join(members.live)} "
                              f"share after {', '.join(members.dropped)} dropped out; the "
                              f"set-up cannot be redone without them")
        return Start(Aligned(rows, rows, 0), agree_bins(job, aggregator, members.live)[1])

    def grow(self, tree: int) -> dict[str, Any]:
        replies = _one_tree(self.config, self.members, tree, get_run_logger())
        self.parties = [self.aggregator, *self.members.live]
        return combine_member_metrics({m: r for m, r in replies.items()
                                       if m in self.members.live})

    def save(self, keep: int | None) -> None:
        save_models(self.job, self.parties)  # every member writes the whole model

    def summary(self, run: TrainingRun) -> dict[str, Any]:
        last = run.history[-1] if run.history else {}
        return {"protocol": "horizontal", "members": self.config.members,
                "dropped": list(self.members.dropped),
                "member_metrics": last.get("members", {})}


def _one_tree(config: HorizontalJobConfig, members: Membership, tree: int,
              logger: Any) -> dict[str, TreeFinished]:
    """Grow one tree, with fewer members only as long as no sum of it was opened; returns the
    metrics of the members that applied it."""
    job, aggregator = config.job, config.aggregator
    while True:
        grown, silent = list(members.live), []
        try:
            silent = _grow_tree(job, aggregator, grown, tree, members.attempt,
                                config.params.max_depth)
        except Regrow as again:
            _drop(config, members, again.silent, tree, logger,
                  f"tree {tree} restarts without them under fresh masks")
            members.attempt += 1
            continue
        if silent:
            _drop(config, members, silent, tree, logger,
                  f"tree {tree} stops where it stood (its open nodes become leaves)")
        break
    try:
        replies = finish_tree(job, aggregator, grown, tree, members.attempt, silent)
    except StepTimeout as exc:  # the tree is complete: the silent members leave after it
        _drop(config, members, _members_in(exc, grown), tree, logger, "the tree is complete")
        replies = {}
    return replies


def _grow_tree(job: str, aggregator: str, members: list[str], tree: int, attempt: int,
               max_depth: int) -> list[str]:
    """FedTree's steps 1-4 for one tree, level by level; returns the members that went silent
    once the root's round key was out (the tree then stops at the level it reached).

    Raises ``Regrow`` for members silent before: their root vectors, if any, stay sealed."""
    try:
        start_tree(job, aggregator, members, tree, attempt)
        update_histograms(job, members, tree, 0, attempt)
    except StepTimeout as exc:
        raise Regrow(_members_in(exc, members)) from None
    silent = _timed_out(lambda: release_round(job, members, tree, attempt), members, [])
    if len(silent) == len(members):  # none may have released: the job cannot go on
        return silent
    for depth in range(max_depth):
        if depth > 0:
            silent = _timed_out(lambda: update_histograms(job, members, tree, depth, attempt,
                                                          silent), members, silent)
            if silent:
                return silent
        open_nodes = secure_sum(job, aggregator, members, tree, depth, attempt)
        silent = _timed_out(lambda: grow(job, members, tree, depth, attempt, silent), members,
                            silent)
        if silent or open_nodes == 0:
            return silent
    return silent


def _timed_out(step: Any, members: list[str], silent: list[str]) -> list[str]:
    """Run a members' step; returns the silent members after it (those before and new)."""
    try:
        step()
    except StepTimeout as exc:
        return [*silent, *_members_in(exc, members)]
    return silent


def _members_in(exc: StepTimeout, members: list[str]) -> list[str]:
    """The silent members of a timeout; the aggregator silent ends the job."""
    silent = [m for m in exc.missing if m in members]
    if not silent:
        raise exc
    return silent


def _drop(config: HorizontalJobConfig, members: Membership, silent: list[str], tree: int,
          logger: Any, then: str) -> None:
    """Drop the members that did not answer; below ``min_members`` the job ends."""
    silent = [m for m in silent if m in members.live]
    if not silent:
        return
    members.live = [m for m in members.live if m not in silent]
    members.dropped.extend(silent)
    link(config.job).leave(silent)
    if len(members.live) < config.min_members:
        raise MembersLost(f"job {config.job}: member(s) {', '.join(silent)} did not answer "
                          f"within {config.transport.step_timeout:.0f} s at tree {tree}; "
                          f"{len(members.live)} member(s) left, min_members is "
                          f"{config.min_members}")
    logger.warning("dropped member(s) %s at tree %d: no answer within %.0f s; %s; %s go on",
                   ", ".join(silent), tree, config.transport.step_timeout, then,
                   ", ".join(members.live))
