"""The toy protocol's flow: open, then per round sums -> leaf -> apply; the run owner
(``flows.run``) does the loop, its timing and progress, the close and the result."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.coordinator import link, step_id
from flows.member_metrics import combine_member_metrics
from flows.run import RunProtocol, Start, TrainingRun, train_run
from messages.bodies import Aligned, PartyInfo, Step
from messages.envelope import MsgType
from tests.toy_protocol.messages import OpenToy, ToySpec
from tests.toy_protocol.protocol import ToyJobConfig


@flow(name="toy_mean", flow_run_name="{config.job}")
def toy_mean(config: ToyJobConfig) -> dict[str, Any]:
    return train_run(config, ToyMean(config))


class ToyMean(RunProtocol):
    """Each round's one leaf: the members' mean residual, summed by the aggregator."""

    config: ToyJobConfig

    def __init__(self, config: ToyJobConfig) -> None:
        super().__init__(config, [config.aggregator, *config.members])
        self.aggregator, self.members = config.aggregator, config.members

    def open(self) -> Start:
        coord = link(self.job)
        coord.begin_session()
        spec = ToySpec([PartyInfo(name, party.role, party.dataset or "")
                        for name, party in self.config.parties.items()],
                       self.config.params.rounds, self.config.params.learning_rate)
        opened = coord.call(self.parties, MsgType.T_OPEN_JOB, OpenToy(spec),
                            step_id(MsgType.T_OPEN_JOB))
        rows = sum(reply.rows for reply in opened.values())
        return Start(Aligned(rows, rows, 0), 1)

    def n_trees(self, start: Start) -> int:
        return self.config.params.rounds

    def grow(self, tree: int) -> dict[str, Any]:
        coord = link(self.job)
        coord.call(self.members, MsgType.T_SEND_SUMS, Step(tree),
                   step_id(MsgType.T_SEND_SUMS, tree))
        coord.call([self.aggregator], MsgType.T_COMBINE, Step(tree),
                   step_id(MsgType.T_COMBINE, tree))
        return combine_member_metrics(coord.call(self.members, MsgType.T_APPLY, Step(tree),
                                                 step_id(MsgType.T_APPLY, tree)))

    def save(self, keep: int | None) -> None:
        link(self.job).call(self.members, MsgType.SAVE_MODEL, Step(), step_id(MsgType.SAVE_MODEL))

    def summary(self, run: TrainingRun) -> dict[str, Any]:
        return {"protocol": "toy_mean", "members": self.members}
