"""The transcript harness's other recorder: the broker's firehose (issue 36, item 5).

One real horizontal job (two members and an aggregator, each its own ``fedboost worker``
process with its own worker file and signing key) runs over the real broker in a virtual host
of this test's own, with RabbitMQ's firehose on for that virtual host only (``rabbitmqctl
trace_on -p``) and a queue bound to its ``amq.rabbitmq.trace`` exchange. Every message any
party published is read back from there, chunks joined, and opened to the envelope its
recipient gets. Then:

- the firehose holds, for every role, every kind of message the embedded hub's recorder saw
  that role receive in the same job (so the embedded harness, which the other checks use, misses
  no kind of message a party really receives);
- the seed replay (``harness.public_seeds``: every integer of the spec and of every body the
  aggregator received, mixed with tree and member numbers) against the root counts the
  aggregator opens from the firehose's messages predicts no more than chance.

The virtual host is created and deleted by the fixture; the shared broker is never stopped,
and tracing is switched off again for this virtual host alone.
"""

from __future__ import annotations

import subprocess
import urllib.parse
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from flows.config import load_config
from messages.envelope import decode_envelope
from tests.privacy.harness import Received, Transcript, public_seeds, record_training
from tests.privacy.test_horizontal_seeds import MAX_BIN, _best_replay, _root_counts, _sizes
from tests.scenarios import DATA, cli_workers, rabbitmqctl

pytestmark = pytest.mark.usefixtures("prefect_harness")

TREES = 12  # _best_replay's chance of half the roots is negligible from 12 trees, ~1% at 4
SUBSAMPLE = 0.8
TRACE_QUEUE = "firehose"


def _ctl(*args: str) -> None:
    done = subprocess.run([rabbitmqctl(), *args], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, f"rabbitmqctl {' '.join(args)}: {done.stderr or done.stdout}"


@pytest.fixture
def traced_vhost(rabbit_url: str) -> Iterator[str]:
    """A virtual host of this test, the firehose on for it and a queue bound to its trace
    exchange; yields its AMQP URL. Deleted (tracing off first) after."""
    import pika

    vhost = f"pdraws-firehose-{uuid.uuid4().hex[:8]}"
    _ctl("add_vhost", vhost)
    try:
        _ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        base = urllib.parse.urlsplit(rabbit_url)
        url = urllib.parse.urlunsplit((base.scheme, base.netloc, "/" + vhost, "", ""))
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        channel.queue_declare(TRACE_QUEUE, durable=False)
        channel.queue_bind(TRACE_QUEUE, "amq.rabbitmq.trace", "publish.#")
        connection.close()
        _ctl("trace_on", "-p", vhost)
        try:
            yield url
        finally:
            _ctl("trace_off", "-p", vhost)
    finally:
        _ctl("delete_vhost", vhost)


def drain_firehose(url: str) -> list[tuple[str, bytes, dict[str, Any]]]:
    """Every traced publish: (routing key, body, its properties' headers and message id)."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    out = []
    while True:
        method, props, body = channel.basic_get(TRACE_QUEUE, auto_ack=True)
        if method is None:
            break
        headers = props.headers or {}
        keys = headers.get("routing_keys") or [""]
        key = keys[0].decode() if isinstance(keys[0], bytes) else str(keys[0])
        out.append((key, body, dict(headers.get("properties") or {})))
    connection.close()
    return out


def firehose_transcript(config: Any, published: list[tuple[str, bytes, dict[str, Any]]]
                        ) -> tuple[Transcript, int]:
    """The envelopes of every message published to a party's inbox or a flow run's reply queue
    (chunks joined by message id), as their recipients open them; and how many such
    publishes could not be opened (none, for an unsealed job)."""
    whole: dict[str, dict[int, bytes]] = defaultdict(dict)
    order: list[str] = []
    for queue, body, props in published:
        if not queue.startswith("fedboost.") or ".work" in queue:  # a party's own work queues
            continue
        mid = props.get("message_id")
        mid = mid.decode() if isinstance(mid, bytes) else str(mid or uuid.uuid4().hex)
        index = int((props.get("headers") or {}).get("fb-index", 0))
        if mid not in whole:
            order.append(mid)
        whole[mid][index] = body
    messages, unopened = [], 0
    for mid in order:
        data = b"".join(part for _, part in sorted(whole[mid].items()))
        try:
            envelope = decode_envelope(msgpack.unpackb(data)["envelope"])
        except Exception:  # noqa: BLE001  counted: the check below wants none
            unopened += 1
            continue
        messages.append(Received(envelope.sender, envelope.recipient, envelope))
    return Transcript(config=config, messages=messages), unopened


def _job(root: Path, names: dict[str, str], files: dict[str, Path], url: str | None,
         job: str) -> dict[str, Any]:
    parties: dict[str, Any] = {
        names[m]: ({"role": "member", "dataset": "homo", "id": "id", "label": "y"} if url else
                   {"role": "member", "data": str(files[m]), "id": "id", "label": "y"})
        for m in files}
    parties[names["aggregator"]] = {"role": "aggregator"}
    wiring: dict[str, Any] = ({"transport": {"kind": "rabbitmq", "url": url,
                                             "step_timeout": 300.0},
                               "signing": {"key_dir": str(root / "keys")}} if url else
                              {"transport": {"kind": "memory"}})
    return {"job": job, "protocol": "horizontal", "parties": parties,
            "params": {"n_trees": TREES, "max_depth": 1, "max_bin": MAX_BIN,
                       "learning_rate": 0.3, "objective": "binary", "subsample": SUBSAMPLE,
                       "seed": 0}, **wiring}


def test_the_firehose_holds_every_kind_the_embedded_recorder_sees_and_replay_finds_nothing(
        traced_vhost: str, tmp_path: Path) -> None:
    import yaml

    from flows.horizontal import horizontal

    tag = uuid.uuid4().hex[:6]
    names = {role: f"{role}-{tag}" for role in ("guest", "host", "aggregator")}
    files = {m: DATA / f"breast_homo_{m}.csv" for m in ("guest", "host")}
    common = {"models": str(tmp_path / "models"),
              "transport": {"kind": "rabbitmq", "url": traced_vhost},
              "signing": {"key_dir": str(tmp_path / "keys")}}
    worker_files = {
        **{m: {"party": names[m], "role": "member",
               "datasets": {"homo": {"data": str(files[m]), "id": "id", "label": "y"}},
               "policy": {"protocols": ["horizontal"]}, **common} for m in files},
        "aggregator": {"party": names["aggregator"], "role": "aggregator",
                       "policy": {"protocols": ["horizontal"]}, **common}}
    job = f"firehose-{tag}"
    with cli_workers(tmp_path, traced_vhost, names, worker_files):
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(_job(tmp_path, names, files, traced_vhost, job)))
        config = load_config(path)
        result = horizontal(config)
        assert result["n_trees"] == TREES
        published = drain_firehose(traced_vhost)
    fire, unopened = firehose_transcript(config, published)
    assert unopened == 0, f"{unopened} published messages could not be opened"
    embedded_config = load_config(_write(tmp_path / "embedded.yaml",
                                         _job(tmp_path, names, files, None, job)))
    embedded = record_training(embedded_config, tmp_path / "embedded")
    roles = [*(names[m] for m in files), names["aggregator"]]
    missing = {r: sorted(k.name for k in embedded.kinds(r) - fire.kinds(r)) for r in roles}
    print(f"FIREHOSE {len(published)} publishes, {len(fire.messages)} messages; kinds per role "
          f"{ {r: len(fire.kinds(r)) for r in roles} }; missing {missing}")
    assert all(embedded.kinds(r) for r in roles)
    assert not any(missing.values()), missing
    # the generic attack on the firehose's transcript: every public integer replayed against
    # the roots the aggregator opens
    aggregator = names["aggregator"]
    roots = _root_counts(_as_aggregator(fire, aggregator))
    assert sorted(roots) == list(range(TREES)), roots
    sizes = _sizes(_as_aggregator(fire, aggregator), [names[m] for m in files])

    def count(rng: np.random.Generator, t: int, n: int) -> int:
        return int((rng.random(n) < SUBSAMPLE).sum())

    hits, candidate = _best_replay(public_seeds(fire, aggregator), roots, [0, 1], sizes, count)
    assert hits <= TREES // 2, f"{candidate} predicts {hits}/{TREES} roots from the firehose"


def _write(path: Path, raw: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(raw))
    return path


def _as_aggregator(transcript: Transcript, aggregator: str) -> Transcript:
    """The transcript with this run's aggregator named ``aggregator`` (the helpers' name)."""
    renamed = [Received(m.sender if m.sender != aggregator else "aggregator",
                        m.recipient if m.recipient != aggregator else "aggregator", m.envelope)
               for m in transcript.messages]
    return Transcript(config=transcript.config, messages=renamed)
