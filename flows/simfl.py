"""SimFL as a Prefect flow (Practical Federated GBDT, seed 000): preprocess once, then per tree
aggregate similar gradients -> grow -> share.

Preprocessing (Algorithm 1): every member hashes its rows with p-stable LSH functions from a
secret the members agree on among themselves and the aggregator tells each member, per row, the
most similar row of every other member; a federation whose members, data and LSH parameters are
unchanged reuses it. Training (Algorithm 2): members take turns growing trees; for each tree the
other members send the builder the summed gradients of their rows similar to each of its rows,
with noise (``workers.simfl.privacy``), the builder estimates them, grows the tree on its own
rows with those weighted gradients and shares it with everyone. In multiclass a round is one
tree per class, all grown by the round's builder.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.coordinator import link, step_id
from flows.member_metrics import combine_member_metrics
from flows.declared.simfl import SimflJobConfig
from flows.run import RunProtocol, Start, TrainingRun, train_run
from messages.bodies import Aligned, Checkpoint, PartyInfo, ResumeJob, Step, TreeFinished
from messages.envelope import MsgType
from messages.simfl import OpenSimfl, Prepare, SimflSpec


def simfl_spec(config: SimflJobConfig) -> SimflSpec:
    """What every party is told about the job (no paths, no data)."""
    p = config.params
    return SimflSpec(
        parties=[PartyInfo(name, party.role, party.dataset or "")
                 for name, party in config.parties.items()],
        params=p.tree_params(), lsh_functions=p.lsh.functions or 0,
        lsh_r=p.lsh.r, lsh_seed=p.lsh.seed, noise_label=p.privacy.label_noise,
        noise_tree=p.privacy.tree_noise, gradient_clip=p.privacy.clip)


def privacy_spent(config: SimflJobConfig, trees: int, per_round: int = 1) -> dict[str, Any]:
    """What the first ``trees`` trees' gradient messages spent, per member as a sender, toward
    each builder (``workers.simfl.privacy``: zCDP, then (epsilon, delta)); ``per_round`` trees
    make a round (the classes in multiclass), all sent to the round's builder.

    ``label_epsilon`` (binary objective): one row's label, over every tree the member sent
    that builder and its label sum, ``rho = T / (2 (sigma_tree^2 + T sigma_label^2)) +
    1 / (2 sigma_tree^2)``. Multiclass: a label changed from class a to class b moves the
    sums of a's trees and of b's trees by 1 each, and each class has its own persistent
    noise, so over the ``R`` rounds sent that builder ``rho = 2 R / (2 (sigma_tree^2 +
    R sigma_label^2))`` (no label sum is sent). ``row_epsilon``: one row's values replaced
    (its gradient and hessian, and the builder row it is similar to), ``rho = 2 T /
    sigma_tree^2`` for the g sums over every tree ``T`` of every class plus ``1 / (2
    sigma_tree^2)`` for the h totals of the whole job (their noise grows with ``sqrt(T)``);
    ``row_epsilon_per_tree`` one tree's g sums and the job's h totals; ``hessian_epsilon``
    the h totals alone, whatever ``T``. The trees a member builds are outside all of them
    (every member receives them).
    """
    members, noise = config.members, config.params.privacy
    delta = noise.delta

    def epsilon(rho: float) -> float:  # Bun and Steinke 2016, Proposition 1.3
        return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))

    def persistent(t: int) -> float:  # one class's sums over t trees, Z shared by them
        return t / (2.0 * (noise.tree_noise ** 2 + t * noise.label_noise ** 2))

    sent = {m: max((sum(1 for t in range(trees) if (t // per_round) % len(members) == b)
                    for b in range(len(members)) if members[b] != m), default=0)
            for m in members}  # to the builder it sent most trees
    if config.params.objective == "binary":  # and the noisy label sum
        label: dict[str, float] | None = {
            m: epsilon(persistent(t) + 1.0 / (2.0 * noise.tree_noise ** 2))
            for m, t in sent.items()}
    elif config.params.objective == "multiclass":  # two classes' sums, per-class noise
        label = {m: epsilon(2.0 * persistent(-(-t // per_round))) for m, t in sent.items()}
    else:
        label = None
    return {"delta": delta, "label_noise": noise.label_noise, "tree_noise": noise.tree_noise,
            "trees_sent": sent,
            "label_epsilon": label,
            "row_epsilon": {m: epsilon((2.0 * t + 0.5) / noise.tree_noise ** 2)
                            for m, t in sent.items()},
            "row_epsilon_per_tree": epsilon(2.5 / noise.tree_noise ** 2),
            "hessian_epsilon": epsilon(0.5 / noise.tree_noise ** 2)}


@task(name="open_job", task_run_name="open-job", cache_policy=NO_CACHE)
def open_job(job: str, parties: list[str], spec: SimflSpec) -> dict[str, Any]:
    """Members load their data sets and bin them; every member reports its checkpoints."""
    coord = link(job)
    coord.begin_session()
    return coord.call(parties, MsgType.S_OPEN_JOB, OpenSimfl(spec), step_id(MsgType.S_OPEN_JOB))


@task(name="resume_job", task_run_name="resume-after-{trees_done}-trees", cache_policy=NO_CACHE)
def resume_job(job: str, members: list[str], trees_done: int,
               shared: Checkpoint) -> dict[str, Any]:
    return link(job).call(members, MsgType.RESUME_JOB, ResumeJob(shared),
                          step_id(MsgType.RESUME_JOB, trees_done))


@task(name="preprocess", task_run_name="preprocess", cache_policy=NO_CACHE)
def preprocess(job: str, aggregator: str, members: list[str]) -> dict[str, Any]:
    """Algorithm 1: LSH values to the aggregator, most similar rows back; reused when every
    member still holds this federation's (same members, data, LSH parameters and objective).
    ``per_round``: the trees per round the members hold (the classes, or 1)."""
    coord = link(job)
    started = time.perf_counter()
    keys = coord.call(members, MsgType.S_MEMBER_KEY, Step(), step_id(MsgType.S_MEMBER_KEY))
    key = hashlib.sha256("".join(sorted(k.key for k in keys.values())).encode()).hexdigest()
    held = coord.call(members, MsgType.S_HASH_ROWS, Prepare(key, False),
                      step_id(MsgType.S_HASH_ROWS))
    reused = all(reply.count > 0 for reply in held.values())
    if not reused:  # one member without it: all again, under the members' secret functions
        sent = coord.call(members, MsgType.S_HASH_ROWS, Prepare(key, True),
                          step_id(MsgType.S_HASH_ROWS, 1))
        coord.call([aggregator], MsgType.S_MATCH_ROWS, Step(), step_id(MsgType.S_MATCH_ROWS))
        got = coord.call(members, MsgType.S_STORE_SIMILAR, Step(),
                         step_id(MsgType.S_STORE_SIMILAR))
        held = coord.call(members, MsgType.S_HASH_ROWS, Prepare(key, False),
                          step_id(MsgType.S_HASH_ROWS, 2))  # now on record: its classes
    per_round = {reply.count for reply in held.values()}
    if len(per_round) != 1 or min(per_round) < 1:
        raise RuntimeError(f"job {job}: the members' preprocessings disagree on the trees per "
                           f"round {sorted(per_round)}; run the job again")
    return {"reused": reused, "per_round": per_round.pop(),
            "seconds": time.perf_counter() - started,
            "bytes": {m: 0 if reused else sent[m].count + got[m].count for m in members}}


@task(name="aggregate_similar_gradients", task_run_name="similar-gradients-t{tree}",
      cache_policy=NO_CACHE)
def aggregate_similar_gradients(job: str, others: list[str], builder: str, tree: int) -> None:
    """Algorithm 2, l.1-8: the other members send the builder their similar rows' gradients."""
    link(job).call(others, MsgType.S_SEND_GRADIENTS, Step(tree, -1, [builder]),
                   step_id(MsgType.S_SEND_GRADIENTS, tree))


@task(name="grow", task_run_name="grow-t{tree}-at-{builder}", cache_policy=NO_CACHE)
def grow(job: str, builder: str, tree: int) -> TreeFinished:
    """Algorithm 2, l.9-21: the builder grows the tree on weighted gradients."""
    reply: TreeFinished = link(job).call([builder], MsgType.S_BUILD_TREE, Step(tree, -1, [builder]),
                                         step_id(MsgType.S_BUILD_TREE, tree))[builder]
    return reply


@task(name="share", task_run_name="share-t{tree}", cache_policy=NO_CACHE)
def share(job: str, others: list[str], builder: str, tree: int) -> dict[str, TreeFinished]:
    """Every other member applies the builder's tree to its rows."""
    return link(job).call(others, MsgType.S_RECEIVE_TREE, Step(tree, -1, [builder]),
                          step_id(MsgType.S_RECEIVE_TREE, tree))


@task(name="save_models", task_run_name="save-models", cache_policy=NO_CACHE)
def save_models(job: str, members: list[str]) -> None:
    link(job).call(members, MsgType.SAVE_MODEL, Step(), step_id(MsgType.SAVE_MODEL))


@flow(name="simfl", flow_run_name="{config.job}")
def simfl(config: SimflJobConfig) -> dict[str, Any]:
    """Train SimFL between members holding different rows of the same columns.

    ``config`` is the job file's content (a deployment's parameter). Running the same job
    again continues after the last tree every member checkpointed.
    """
    return train_run(config, Simfl(config))


class Simfl(RunProtocol):
    """SimFL's run: members take turns building trees on their similar rows' gradients."""

    config: SimflJobConfig

    def __init__(self, config: SimflJobConfig) -> None:
        super().__init__(config, [config.aggregator, *config.members])
        self.aggregator, self.members = config.aggregator, config.members
        self.prep: dict[str, Any] = {}
        self.per_round = 1

    def open(self) -> Start:
        job, members = self.job, self.members
        opened = open_job(job, self.parties, simfl_spec(self.config))
        n_rows = sum(reply.rows for reply in opened.values())
        rows = Aligned(n_rows, n_rows, 0)
        shared = set.intersection(*(set(opened[m].checkpoints) for m in members))
        if shared:
            newest = max(shared, key=lambda c: c.trees_done)
            resumed = resume_job(job, members, newest.trees_done, newest)
            done, self.per_round = newest.trees_done, resumed[members[0]].outputs
            self.prep = {"reused": True, "seconds": 0.0, "bytes": {m: 0 for m in members}}
            return Start(rows, self.per_round, done,
                         [combine_member_metrics({m: resumed[m].history[k] for m in members})
                          for k in range(done)])
        self.prep = preprocess(job, self.aggregator, members)
        get_run_logger().info("preprocessing %s in %.2f s",
                              "reused" if self.prep["reused"] else "done", self.prep["seconds"])
        self.per_round = self.prep["per_round"]
        return Start(rows, self.per_round)

    def grow(self, tree: int) -> dict[str, Any]:
        """Algorithm 2 for one tree, at the round's builder."""
        job, members = self.job, self.members
        builder = members[(tree // self.per_round) % len(members)]
        others = [m for m in members if m != builder]
        aggregate_similar_gradients(job, others, builder, tree)
        built = grow(job, builder, tree)
        metrics = combine_member_metrics({builder: built, **share(job, others, builder, tree)})
        return {**metrics, "builder": builder}

    def save(self, keep: int | None) -> None:
        save_models(self.job, self.members)  # every member writes the whole model

    def summary(self, run: TrainingRun) -> dict[str, Any]:
        members = self.members
        last = run.history[-1] if run.history else {}
        sizes = [m["members"][m["builder"]] for m in run.history if "builder" in m]
        per_tree = [s.get("tree_bytes", 0.0) * (len(members) - 1) + s.get("gradient_bytes", 0.0)
                    for s in sizes]
        return {"protocol": "simfl", "members": members,
                "member_metrics": last.get("members", {}),
                "preprocess_reused": self.prep["reused"],
                "preprocess_seconds": self.prep["seconds"],
                "preprocess_bytes": self.prep["bytes"],
                "tree_bytes": sum(per_tree) / len(per_tree) if per_tree else None,
                "privacy": privacy_spent(self.config, run.n_trees, self.per_round)}
