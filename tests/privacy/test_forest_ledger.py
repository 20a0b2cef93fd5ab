"""The forest's feature budget holds per passive data set, across jobs and worker restarts
(issue 36, item 4; ``workers.forest.budget``).

The chosen-label attack of ``test_malicious_active.py`` (labels in the honest 1-bit shape,
row-block splits down to pairs, at each level as many passive features as the budget allows,
rotating) spends one tree's budget at every level. Kept in the worker's memory per job (as on
a873a89), the budget came back whole for a second job over the same rows, or for the same job
once the worker restarted: the attack read the next features of the same rows. Now the passive
party keeps the sums per data set in its private folder and the second job is refused at its
first level beyond what honest draws sum over both.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np
import pytest

from crypto.paillier import PaillierPrivateKey, PaillierPublicKey
from fedboost.embedded import embedded_policy
from messages.envelope import Envelope, Kind, MsgType
from messages.forest import OpenForest
from messages.transport import MemoryHub
from tests.privacy.test_malicious_active import (_chosen_label_forest, _forest_spec, host_bins,
                                                 keypair)
from tests.scenarios import DATA
from tests.workers.test_chosen_gradients import Host
from tests.workers.test_tree_start import SEALERS
from workers.forest.passive import PassiveForest
from workers.party import PartySpec
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

__all__ = ["host_bins", "keypair"]  # the fixtures, shared


class ForestHost(Host):
    """A real passive worker (the embedded default's policy) with a forest job open in
    ``folder``; a new one on the same folder is the worker restarted."""

    def __init__(self, folder: Path, job: str) -> None:
        self.hub = MemoryHub(["host", "guest", "flow"])
        party = PartySpec("host", "passive", str(DATA / "breast_hetero_host.csv"), "id", None,
                          str(folder), policy=embedded_policy())
        self.worker = Worker(party, self.hub.endpoint("host"), PROTOCOLS, SEALERS["host"])
        self.tasks, self.job, self.run_id = 0, job, secrets.token_hex(4)  # a fresh flow run
        self.opened = self.command(MsgType.F_OPEN_JOB, OpenForest(_forest_spec(569)))
        assert self.opened.kind == MsgType.F_OPENED, self.opened.body

    def command(self, kind: Kind, body: object) -> Envelope:
        self.tasks += 1
        self.worker.handle_bytes(SEALERS["flow"].seal(Envelope(
            self.job, f"{self.run_id}/task{self.tasks}", "flow", "host", kind, body)))
        data = self.hub.endpoint("flow").receive(timeout=10)
        assert data is not None
        return SEALERS["flow"].open(data)

    @property
    def run(self) -> PassiveForest:
        run: PassiveForest = self.worker.jobs[self.job].state.role_state
        return run


@pytest.mark.parametrize("second", ["a second job", "the worker restarted"])
def test_the_forest_feature_budget_is_the_data_sets_across_jobs_and_restarts(
        tmp_path: Path, host_bins: np.ndarray,
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey], second: str) -> None:
    n_rows, n_features = host_bins.shape
    first = ForestHost(tmp_path, "job")
    read, refused = _chosen_label_forest(host_bins, keypair, greedy=True, run=first.run)
    assert refused == "", refused
    once = int((read >= 0).sum())
    assert once == 2_362  # the one-tree attack, as test_malicious_active pins it
    again = ForestHost(tmp_path, "job" if second == "the worker restarted" else "job-2")
    # the next features of the same rows
    more, refused = _chosen_label_forest(host_bins, keypair, greedy=True, run=again.run,
                                         turn=n_features // 2)
    both = int(((read >= 0) | (more >= 0)).sum())
    print(f"FOREST-LEDGER {second}: one tree {once} cells, with the second {both}; "
          f"refused: {refused!r}")
    # a873a89: the second read as much again (4,724 cells in all); now refused at level 1
    assert "refused histograms" in refused and "over every forest job on this data set" \
        in refused, refused
    assert both - once < once // 4, (once, both)
