"""The vertical random forest as a Prefect flow (seed 002, Alg. 1-4).

Align entities, then the active party encrypts its labels once and every party bins its
features; then the trees, independent of each other, grow as tasks running side by side, each
level in three steps: build encrypted histograms -> find splits -> apply splits. A tree whose
step fails (a party's process died, a step timed out) is grown again, up to
``params.tree_retries`` times, then dropped; the forest is saved with the trees it has when at
least ``params.min_trees`` finished. A party that lost its state (its worker restarted) makes
the flow open the job again: every party keeps each finished tree on disk, so only the
unfinished ones grow again (also for ``fedboost resume`` and Retry in the UI).
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from flows.coordinator import JobStopped, PartyError, StepTimeout, align_entities, link
from flows.declared.forest import ForestJobConfig
from flows.run import RunProtocol, Start, TrainingRun, train_run
from flows.secureboost import evaluate_validation
from messages.bodies import Ack, PartyInfo
from messages.secureboost import SplitsFound
from messages.envelope import Kind, MsgType
from messages.forest import MAX_TREES, ForestOpened, ForestSpec, OpenForest, TreeCommand


def forest_spec(config: ForestJobConfig) -> ForestSpec:
    """What every party is told about the job (no paths, no data)."""
    p = config.params
    return ForestSpec(
        parties=[PartyInfo(name, party.role, party.dataset or "")
                 for name, party in config.parties.items()],
        params=p.forest_params(), key_bits=config.crypto.key_bits,
        valid_fraction=config.validation.fraction, valid_seed=config.validation.seed,
        label=config.parties[config.active].label or "", scheme=config.crypto.scheme)


def _step(kind: Kind, work: int = -1, depth: int = -1) -> str:
    return f"{kind.name.lower()}/w{work}/d{depth}"


@task(name="open_forest", task_run_name="open-job", cache_policy=NO_CACHE)
def open_forest(job: str, parties: list[str], spec: ForestSpec) -> dict[str, list[int]]:
    """Every party loads its data (the active party makes a key pair) and reports the trees it
    kept from an earlier run of this job; a new session makes older messages stale."""
    coord = link(job)
    coord.begin_session()
    replies = coord.call(parties, MsgType.F_OPEN_JOB, OpenForest(spec),
                         _step(MsgType.F_OPEN_JOB))
    opened: dict[str, ForestOpened] = replies
    return {party: list(reply.trees) for party, reply in opened.items()}


@task(name="prepare", task_run_name="encrypt-labels-and-bin", cache_policy=NO_CACHE)
def prepare(job: str, parties: list[str], keep: list[int]) -> int:
    """The active party encrypts its labels once and sends them; every party bins its features
    and loads the trees kept; returns the active party's feature count (its own and the
    passive parties')."""
    replies = link(job).call(parties, MsgType.F_PREPARE, TreeCommand(keep=keep),
                             _step(MsgType.F_PREPARE))
    return int(replies[parties[0]].count)


@task(name="grow_tree", task_run_name="grow-tree-{tree}", cache_policy=NO_CACHE)
def grow_tree(job: str, active: str, passives: list[str], tree: int, max_depth: int,
              retries: int) -> float | None:
    """Grow one tree, again after a failure (a fresh attempt), up to ``retries`` times;
    returns its seconds, or None when it is dropped. A party that lost its state fails the
    task: the flow opens the job again."""
    logger = get_run_logger()
    for attempt in range(retries + 1):
        started = time.perf_counter()
        work = attempt * MAX_TREES + tree
        try:
            _grow(link(job), active, passives, work, max_depth)
            return time.perf_counter() - started
        except PartyError as exc:
            if exc.reply.state_lost or exc.user_error:
                raise
            logger.warning("tree %d, attempt %d failed: %s", tree, attempt + 1, exc)
        except StepTimeout as exc:
            logger.warning("tree %d, attempt %d failed: %s", tree, attempt + 1, exc)
    logger.warning("tree %d dropped after %d attempts", tree, retries + 1)
    return None


def _grow(coord: Any, active: str, passives: list[str], work: int, max_depth: int) -> None:
    """One attempt: per level, histograms -> splits -> owners apply; then the leaves."""
    everyone = [active, *passives]
    for depth in range(max_depth):
        opened: dict[str, Ack] = coord.call(everyone, MsgType.F_LEVEL,
                                            TreeCommand(work, depth),
                                            _step(MsgType.F_LEVEL, work, depth))
        if opened[active].count == 0:
            break
        found: SplitsFound = coord.call([active], MsgType.F_FIND_SPLITS,
                                        TreeCommand(work, depth),
                                        _step(MsgType.F_FIND_SPLITS, work, depth))[active]
        if found.owners:
            coord.call(found.owners, MsgType.F_APPLY_SPLITS, TreeCommand(work, depth),
                       _step(MsgType.F_APPLY_SPLITS, work, depth))
        if found.n_splits == 0:
            break
    coord.call(everyone, MsgType.F_FINISH_TREE, TreeCommand(work),
               _step(MsgType.F_FINISH_TREE, work))


@task(name="save_forest", task_run_name="save-models", cache_policy=NO_CACHE)
def save_forest(job: str, parties: list[str], trees: list[int]) -> None:
    """Each party writes its part of the forest of ``trees``."""
    link(job).call(parties, MsgType.F_SAVE_MODEL, TreeCommand(keep=trees),
                   _step(MsgType.F_SAVE_MODEL))


@flow(name="vertical_random_forest", flow_run_name="{config.job}",
      task_runner=ThreadPoolTaskRunner(max_workers=64))  # type: ignore[arg-type]  # Prefect's
# stubs infer ThreadPoolTaskRunner[Never] from a call without futures
def vertical_random_forest(config: ForestJobConfig) -> dict[str, Any]:
    """Train a random forest between one active and several passive parties (seed 002).

    ``config`` is the job file's content (a deployment's parameter); over RabbitMQ the flow
    connects to the running party workers itself.
    """
    return train_run(config, Forest(config))


class Forest(RunProtocol):
    """The vertical forest's run: independent trees, grown side by side."""

    config: ForestJobConfig

    def __init__(self, config: ForestJobConfig) -> None:
        super().__init__(config, [config.active, *config.passives])
        self.active, self.passives = config.active, config.passives
        self.keep: list[int] = []  # trees an earlier run finished
        self.seconds: dict[int, float | None] = {}  # None: dropped after its retries
        self.n_valid = 0

    def n_trees(self, start: Start) -> int:
        return self.config.params.n_trees

    def open(self) -> Start:
        job, params = self.job, self.config.params
        held = open_forest(job, self.parties, forest_spec(self.config))
        self.keep = sorted(set.intersection(*(set(t) for t in held.values()))
                           & set(range(params.n_trees)))
        if self.keep:
            get_run_logger().info("%d trees finished by an earlier run are kept",
                                  len(self.keep))
        aligned = align_entities(job, self.active, self.passives)
        prepare(job, self.parties, self.keep)
        get_run_logger().info("labels encrypted once")  # not the feature count: the log is shared
        self.seconds, self.n_valid = {}, aligned.n_valid
        return Start(aligned, 1, len(self.keep))

    def grow_all(self, run: TrainingRun) -> None:
        """Every tree not kept, ``params.parallel_trees`` at a time."""
        job, params, logger = self.job, self.config.params, get_run_logger()
        todo = [t for t in range(params.n_trees) if t not in self.keep]
        running: dict[Any, int] = {}
        lost: PartyError | None = None
        growing = time.perf_counter()
        while (todo or running) and lost is None:
            while todo and len(running) < params.parallel_trees:
                tree = todo.pop(0)
                running[grow_tree.submit(job, self.active, self.passives, tree,
                                         params.max_depth, params.tree_retries)] = tree
            # Prefect's thread futures wrap concurrent ones: wait for the first tree to end
            ended, _ = wait([f.wrapped_future for f in running], return_when=FIRST_COMPLETED)
            for future in [f for f in running if f.wrapped_future in ended]:
                tree = running.pop(future)
                try:
                    self.seconds[tree] = future.result()
                except PartyError as exc:
                    if not exc.reply.state_lost:
                        raise
                    lost = exc  # the job is opened again (train_with_recoveries)
                    link(job).abandon(exc.reply)  # the other trees stop waiting for that party
            grown = sum(1 for s in self.seconds.values() if s is not None)
            # trees grow side by side: seconds per tree is the wall time per finished tree
            run.record(len(self.keep) + grown, (time.perf_counter() - growing) / max(1, grown),
                       {})
            logger.info("trees: %d of %d done, %d dropped", len(self.keep) + grown,
                        params.n_trees, sum(1 for s in self.seconds.values() if s is None))
        if running:  # the rest fail the same way, or finish (and are kept)
            wait([f.wrapped_future for f in running])
        if lost is not None:
            raise lost
        trees = self.trees()
        least = params.min_trees or params.n_trees
        if len(trees) < least:
            raise JobStopped(f"job {job}: only {len(trees)} of {params.n_trees} trees finished "
                             f"({len(self.dropped())} dropped after {params.tree_retries + 1} "
                             f"attempts each); params.min_trees is {least}")
        run.tree_seconds = [self.seconds.get(t) for t in range(params.n_trees)]
        run.history = [{"kept": float(t in trees)} for t in range(params.n_trees)]

    def trees(self) -> list[int]:
        """The forest's trees: kept and grown."""
        return sorted(self.keep + [t for t, s in self.seconds.items() if s is not None])

    def dropped(self) -> list[int]:
        return sorted(t for t, s in self.seconds.items() if s is None)

    def save(self, keep: int | None) -> None:
        save_forest(self.job, self.parties, self.trees())

    def summary(self, run: TrainingRun) -> dict[str, Any]:
        """The forest's counts, and the saved forest scored on the hold-out rows."""
        result: dict[str, Any] = {"n_trees": len(self.trees()), "trees_dropped": self.dropped(),
                                  "dropped": len(self.dropped()),
                                  "trees_trained": len(self.seconds)}
        if self.n_valid:
            result.update(evaluate_validation(self.job, self.active, self.passives,
                                              self.n_valid)[0])
        return {**result, "key_bits": self.config.crypto.key_bits}
