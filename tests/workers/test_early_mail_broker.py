"""Over the real broker, in each of the four protocols: a peer's messages that reach a party's
queue before the flow's opener of their job are delivered to the job once it opens (issue 23
item 7: a horizontal member dropped another's mask key, "H_MASK_KEY for unknown job", and the
job waited out its step timeout). The order is made, not hoped for: the peers publish first,
then the flow publishes the opener, then the party's worker reads its queue. A large message
arrives in signed chunks; a federation party that is not in the job is refused once it opens.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.config import parse_config
from flows.forest import forest_spec
from flows.horizontal import horizontal_spec
from flows.secureboost import job_spec
from flows.simfl import simfl_spec
from messages import bodies as b
from messages import secureboost as sb
from messages import forest as f
from messages import horizontal as h
from messages import simfl as s
from messages.chunks import FrameSigner
from messages.envelope import REPLIES, Envelope, MsgType
from messages.rabbit_queues import delete_party_queues
from messages.rabbitmq import RabbitTransport
from messages.signing import federation_sealers
from tests.messages.test_codec import SAMPLES
from tests.scenarios import CONFIGS, DATA
from workers.column_partitioned.alignment import STAGE_ACTIVE_IDS
from workers.mailbox import mail_key
from workers.party import PartySpec
from workers.policy import PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

LARGE = 20_000
"""Bytes of the large peer message: 20 chunks of the senders' 1 KiB."""
HETERO = {"guest": (DATA / "breast_hetero_guest.csv", "y"),
          "host": (DATA / "breast_hetero_host.csv", None)}
HOMO = {"guest": (DATA / "breast_homo_guest.csv", "y"),
        "host": (DATA / "breast_homo_host.csv", "y")}
CASES: dict[str, Any] = {
    # protocol: (data, roles, the opener, its body's class and spec, peer messages to the host)
    "vertical_secureboost": (
        HETERO, {"guest": "active", "host": "passive"}, MsgType.OPEN_JOB,
        lambda c: sb.OpenJob(job_spec(c)),
        [("guest", MsgType.PSI_POINTS, b.PsiPoints(STAGE_ACTIVE_IDS, b"\1" * LARGE)),
         ("guest", MsgType.ALIGNED_ROWS, SAMPLES[MsgType.ALIGNED_ROWS]),
         ("guest", MsgType.PUBLIC_KEY, SAMPLES[MsgType.PUBLIC_KEY])]),
    "vertical_random_forest": (
        HETERO, {"guest": "active", "host": "passive"}, MsgType.F_OPEN_JOB,
        lambda c: f.OpenForest(forest_spec(c)),
        [("guest", MsgType.ALIGNED_ROWS, SAMPLES[MsgType.ALIGNED_ROWS]),
         ("guest", MsgType.PUBLIC_KEY, SAMPLES[MsgType.PUBLIC_KEY]),
         ("guest", MsgType.F_LABELS, dataclasses.replace(SAMPLES[MsgType.F_LABELS],
                                                         ciphertexts=b"\2" * LARGE))]),
    "horizontal": (
        HOMO, {"guest": "member", "host": "member", "aggregator": "aggregator"},
        MsgType.H_OPEN_JOB, lambda c: h.OpenHorizontal(horizontal_spec(c)),
        [("guest", MsgType.H_MASK_KEY, SAMPLES[MsgType.H_MASK_KEY]),
         ("aggregator", MsgType.H_CUTS, SAMPLES[MsgType.H_CUTS])]),
    "simfl": (
        HOMO, {"guest": "member", "host": "member", "aggregator": "aggregator"},
        MsgType.S_OPEN_JOB, lambda c: s.OpenSimfl(simfl_spec(c)),
        [("aggregator", MsgType.S_SIMILAR, SAMPLES[MsgType.S_SIMILAR]),
         ("guest", MsgType.S_GRADIENTS, SAMPLES[MsgType.S_GRADIENTS])]),
}


@pytest.fixture
def names(rabbit_url: str) -> Iterator[dict[str, str]]:
    """This test's party names (their own queues), deleted afterwards."""
    tag = uuid.uuid4().hex[:8]
    names = {role: f"{role}-{tag}" for role in ("guest", "host", "aggregator", "stranger")}
    yield names
    delete_party_queues(rabbit_url, list(names.values()))


def _config(protocol: str, names: dict[str, str]) -> Any:
    data, roles, *_ = CASES[protocol]
    parties = {names[p]: {"role": role, **({"data": str(data[p][0]), "id": "id"}
                                           | ({"label": data[p][1]} if data[p][1] else {})
                                           if p in data else {})}
               for p, role in roles.items()}
    params: dict[str, Any] = {"n_trees": 2, "max_depth": 2, "max_bin": 16, "objective": "binary"}
    if protocol == "simfl":
        params["lsh"] = {"r": 4.0, "seed": 0}
    vertical = {"crypto": {"key_bits": 1024}} if protocol.startswith("vertical") else {}
    return parse_config({"job": f"early-{names['host']}", "protocol": protocol,
                         "parties": parties, "params": params, **vertical},
                        base=CONFIGS, source=protocol)


@pytest.mark.parametrize("protocol", list(CASES))
def test_peer_messages_before_the_opener_reach_the_job(protocol: str, rabbit_url: str,
                                                       names: dict[str, str], tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: the host's worker, the peers and the flow, each on its own connection
    data, roles, opener, body_of, peer_mail = CASES[protocol]
    config = _config(protocol, names)
    sealers = federation_sealers(list(names.values()))
    flow_name = f"flow.{config.job}.t"

    def endpoint(name: str, **kwargs: Any) -> RabbitTransport:
        return RabbitTransport(name, rabbit_url, chunk_bytes=1024, frames=FrameSigner(
            sealers[name.split(".")[0]]), **kwargs)

    host = endpoint(names["host"], party=True)
    peers = {p: endpoint(names[p], party=True) for p in ("guest", "aggregator", "stranger")}
    flow = endpoint(flow_name, party=False)
    party = PartySpec(names["host"], roles["host"], str(data["host"][0]), "id",
                      data["host"][1], str(tmp_path),
                      policy=PartyPolicy(min_key_bits=1024, protocols=tuple(CASES)))
    worker = Worker(party, host, PROTOCOLS, sealers[names["host"]])
    caplog.set_level(logging.INFO)
    try:
        # Execute: the peers' messages reach the host's queue, then the flow's opener
        sent = [Envelope(config.job, "s1/open", names[p], names["host"], kind, body)
                for p, kind, body in peer_mail]
        sent.append(Envelope(config.job, "s1/open", names["stranger"], names["host"],
                             *peer_mail[0][1:]))
        for env in sent:
            peers[next(p for p in peers if names[p] == env.sender)].send(
                names["host"], sealers[env.sender].seal(env))
        flow.send(names["host"], sealers["flow"].seal(Envelope(
            config.job, "s1/open", flow_name, names["host"], opener, body_of(config))))
        reply = None
        while reply is None:  # the host's worker reads its queue in order, as serve() does
            raw = host.receive(timeout=30)
            assert raw is not None, "the host's worker got no opener"
            worker.handle_bytes(raw)
            host.acknowledge()
            answer = flow.receive(timeout=0.05)
            if answer is not None:
                flow.acknowledge()
                reply = sealers["flow"].open(answer)
        # Assert: the job opened, and holds every party's early message in its mailbox
        assert reply.kind in REPLIES and reply.kind != MsgType.ERROR, reply.body
        assert "for unknown job" not in caplog.text
        filed = worker.jobs[config.job].mailbox.items
        for env in sent[:-1]:
            assert mail_key(env) in filed, f"{env.kind.name} from {env.sender} was lost"
        assert (f"rejected {sent[-1].kind.name} from {names['stranger']!r}: not a party of "
                f"job {config.job!r}") in caplog.text
        assert len(worker.early) == 0
    finally:
        for transport in (host, flow, *peers.values()):
            transport.close()
