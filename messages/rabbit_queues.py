"""The queues fedboost uses on a RabbitMQ broker.

No exchange of our own: the default exchange routes by queue name, so nobody needs the right to
create bindings, which would let a party bind another party's traffic.

- ``fedboost.<party>``: the party's inbox (durable, single active consumer). Every process of
  the party subscribes; the broker lets exactly one consume, so a standby takes over if it dies.
- ``fedboost.<party>.work``: the party's own work queue (durable, competing consumers): a
  level's histogram data, one shard per helper process. A shard larger than a chunk waits in
  its own ``fedboost.<party>.work.<id>`` queue and the work queue carries a ticket naming it:
  chunks on a shared queue would be dealt to different helpers. Shards are published by a
  thread of their own (``messages._work_publisher``), so the coordinating process sums meanwhile.
- ``fedboost.<party>.work.<id>.units``: a claim pool, one token per unit of a level's work
  (a feature); each of the party's processes takes tokens one at a time, so each unit goes to
  exactly one process and faster processes take more.
- ``fedboost.flow.<id>``: a flow run's reply queue (durable, expires a day after last use).
- ``fedboost.flows.out`` / ``fedboost.flows.in``: exchanges only a broker of one organisation
  among several has (``messages.broker_links``): replies to flow runs leave through the first
  and arrive at the organisation running the flows through the second.
"""

from __future__ import annotations

import pika

from messages.tls import TlsOptions, ssl_options_for

QUEUE_PREFIX = "fedboost."
INBOX_ARGUMENTS = {"x-single-active-consumer": True}
DATA_QUEUE_ARGUMENTS = {"x-expires": 24 * 3600 * 1000}
FLOW_QUEUE_ARGUMENTS = {"x-expires": 24 * 3600 * 1000}
FLOWS_OUT = QUEUE_PREFIX + "flows.out"
FLOWS_IN = QUEUE_PREFIX + "flows.in"


def queue_of(participant: str) -> str:
    """The inbox queue of a party (``host``) or of a flow run (``flow.<id>``)."""
    return QUEUE_PREFIX + participant


def work_queue_of(party: str) -> str:
    """A party's own work queue (histogram shards for its helper processes)."""
    return QUEUE_PREFIX + party + ".work"


def delete_party_queues(url: str, parties: list[str], tls: TlsOptions | None = None) -> None:
    """Remove parties' inbox and work queues (tests and benchmarks that made their own)."""
    params = pika.URLParameters(url)
    params.ssl_options = ssl_options_for("cleanup", url, tls)
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        for party in parties:
            channel.queue_delete(queue_of(party))
            channel.queue_delete(work_queue_of(party))
    finally:
        connection.close()

