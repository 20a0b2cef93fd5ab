"""The toy protocol's flow: open, then per round sums -> leaf -> apply, then save and close."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow

from flows.coordinator import close_job, link, record_tree, step_id, train_with_recoveries
from flows.member_metrics import combine_member_metrics
from messages.bodies import PartyInfo, Step
from messages.envelope import MsgType
from tests.toy_protocol.messages import OpenToy, ToySpec
from tests.toy_protocol.protocol import ToyJobConfig


@flow(name="toy_mean", flow_run_name="{config.job}")
def toy_mean(config: ToyJobConfig) -> dict[str, Any]:
    return train_with_recoveries(config, _train)


def _train(config: ToyJobConfig, progress: Any) -> dict[str, Any]:
    job, aggregator, members = config.job, config.aggregator, config.members
    coord = link(job)
    coord.begin_session()
    started = time.perf_counter()
    spec = ToySpec([PartyInfo(name, party.role, party.dataset or "")
                    for name, party in config.parties.items()],
                   config.params.rounds, config.params.learning_rate)
    opened = coord.call([aggregator, *members], MsgType.T_OPEN_JOB, OpenToy(spec),
                        step_id(MsgType.T_OPEN_JOB))
    rows = sum(reply.rows for reply in opened.values())
    history: list[dict[str, Any]] = []
    seconds: list[float | None] = []
    for round_ in range(config.params.rounds):
        begun = time.perf_counter()
        coord.call(members, MsgType.T_SEND_SUMS, Step(round_), step_id(MsgType.T_SEND_SUMS, round_))
        coord.call([aggregator], MsgType.T_COMBINE, Step(round_),
                   step_id(MsgType.T_COMBINE, round_))
        applied = coord.call(members, MsgType.T_APPLY, Step(round_),
                             step_id(MsgType.T_APPLY, round_))
        metrics = combine_member_metrics(applied)
        history.append(metrics)
        seconds.append(time.perf_counter() - begun)
        record_tree(job, progress, round_ + 1, config.params.rounds, seconds[-1], metrics)
    coord.call(members, MsgType.SAVE_MODEL, Step(), step_id(MsgType.SAVE_MODEL))
    close_job(job, [aggregator, *members])
    return {"n_aligned": rows, "n_train": rows, "n_valid": 0, "n_trees": config.params.rounds,
            **{k: v for k, v in history[-1].items() if k.startswith("train_")},
            "resumed_after": 0, "trees_trained": config.params.rounds,
            "train_seconds": time.perf_counter() - started, "tree_seconds": seconds,
            "history": history, "protocol": "toy_mean", "members": members}
