"""Vertical SecureBoost as a Prefect flow (SecureBoost Alg. 1-2; Completely SecureBoost, sec. 6).

The flow body is the algorithm's loop: align entities, bin features, then per tree encrypt
gradients and, per depth, build encrypted histograms -> find best splits -> apply splits ->
broadcast nodes; finally finish the tree. Each task is one command to the parties and returns
only counts, owners and metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture

from flows.coordinator import Sent, align_entities, link, step_id
from flows.declared.secureboost import SecureBoostJobConfig
from flows.job_schema import PrivacyConfig
from flows.predict import traverse_level_once
from flows.run import RunProtocol, Start, TrainingRun, train_run
from messages.bodies import (Ack, Aligned, Checkpoint, PartyInfo, ResumeJob, Resumed, Step,
                             TreeFinished)
from messages.secureboost import VALIDATION_BATCH, JobSpec, OpenJob, SplitsFound
from messages.envelope import MsgType


def job_spec(config: SecureBoostJobConfig) -> JobSpec:
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
def drop_tree(job: str, dropping: Sent, tree: int, held: Callable[[], None]) -> None:
    """Passive parties drop the tree's ciphertexts and checkpoint it; then the run's progress
    counts the tree (every party holds it). Sent before the next tree's gradients (on a slow
    link it would wait behind them: 13 s at 10 Mbit/s), then submitted, not waited for: its
    round trip runs beside those gradients (``SecureBoost.settle`` before that tree's first
    histograms are asked for)."""
    link(job).collect(dropping)
    held()


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
def vertical_secureboost(config: SecureBoostJobConfig) -> dict[str, Any]:
    """Train a SecureBoost model between one active and several passive parties.

    ``config`` is the job file's content (a deployment's parameter). Over RabbitMQ the flow
    connects to the running party workers itself; the embedded default attaches its own.
    Running the same job again (``fedboost resume``, the same ``fedboost train``, Retry in the
    UI) continues after the last tree every party checkpointed; so does this run when a party's
    worker restarts mid-job.
    """
    return train_run(config, SecureBoost(config))


class SecureBoost(RunProtocol):
    """SecureBoost's run: one active party, passive parties summing ciphertexts."""

    config: SecureBoostJobConfig

    def __init__(self, config: SecureBoostJobConfig) -> None:
        super().__init__(config, [config.active, *config.passives])
        self.active, self.passives = config.active, config.passives
        self.per_round, self.n_valid = 1, 0
        self.dropping: list[PrefectFuture[None]] = []  # the previous tree at the passive parties

    def open(self) -> Start:
        job, active, passives = self.job, self.active, self.passives
        self.dropping = []  # a recovery's new session: the old run's drops are not this run's
        held = open_job(job, self.parties, job_spec(self.config))
        shared = set.intersection(*(set(points) for points in held.values()))
        if shared:
            newest = max(shared, key=lambda c: c.trees_done)
            resumed = resume_job(job, active, passives, newest.trees_done, newest)
            self.per_round, self.n_valid = resumed.outputs, resumed.n_valid
            return Start(Aligned(resumed.n_aligned, resumed.n_train, resumed.n_valid),
                         resumed.outputs, resumed.trees_done,
                         [{m.name: m.value for m in t.metrics} for t in resumed.history])
        aligned = align_entities(job, active, passives)
        self.per_round, self.n_valid = bin_features(job, active, passives), aligned.n_valid
        return Start(aligned, self.per_round)

    def grow(self, tree: int) -> dict[str, Any]:
        """Alg. 1-2 for one tree: gradients, then per depth histograms -> splits -> nodes."""
        job, active, passives, params = self.job, self.active, self.passives, self.config.params
        # Completely SecureBoost: the first round (one tree per class) stays with the active party
        members = [] if params.complete_secure and tree < self.per_round else passives
        encrypt_gradients(job, active, tree)
        self.settle()
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
        return finish_tree(job, active, tree)  # the passive parties' checkpoint follows

    def hold(self, tree: int, held: Callable[[], None]) -> None:
        sent = link(self.job).send(self.passives, MsgType.FINISH_TREE, Step(tree),
                                   step_id(MsgType.FINISH_TREE, tree))
        self.dropping.append(drop_tree.submit(self.job, sent, tree, held))

    def settle(self) -> None:
        while self.dropping:  # the passive parties' drop of the trees before
            self.dropping.pop().result()

    def validate(self, after: int = -1) -> tuple[dict[str, float], list[dict[str, float]]]:
        return evaluate_validation(self.job, self.active, self.passives,
                                   self.n_valid, after)

    def save(self, keep: int | None) -> None:
        save_models(self.job, self.parties, -1 if keep is None else keep)

    def summary(self, run: TrainingRun) -> dict[str, Any]:
        return {"key_bits": self.config.crypto.key_bits}
