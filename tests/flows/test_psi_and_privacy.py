"""PSI under realistic id mismatch, and what crosses the wire (recorded on the transport)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from boosting.tree import load_model
from fedboost.embedded import FLOW_ENDPOINT, train_embedded
from messages.envelope import MsgType, decode_envelope
from messages.transport import MemoryHub
from tests.scenarios import (DATA, assert_same_trees, centralized_view, config_with,
                             federated_view, train_centralized)

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _envelope(sealed: bytes):  # type: ignore[no-untyped-def]
    """The envelope inside a signed message (the recorder sees what crossed the wire)."""
    return decode_envelope(msgpack.unpackb(sealed)["envelope"])


def test_psi_string_ids_shuffled_partial_overlap(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    out = {}
    ids_kept = {}
    for party in ("guest", "host"):
        lines = (DATA / f"default_credit_hetero_{party}.csv").read_text().splitlines()
        rows = [f"cust-{line.split(',', 1)[0]}-x,{line.split(',', 1)[1]}" for line in lines[1:]]
        rng.shuffle(rows)
        rows = rows[: int(len(rows) * 0.9)]  # 10% of each side's rows are unknown to the other
        ids_kept[party] = {r.split(",", 1)[0] for r in rows}
        out[party] = _write(tmp_path / f"{party}.csv", lines[0], rows)
    truth = len(ids_kept["guest"] & ids_kept["host"])
    config = config_with("default_credit.yaml", crypto={"key_bits": 1024}, params={"n_trees": 2},
                         parties={"guest": {"role": "active", "data": str(out["guest"]), "label": "y"},
                                  "host": {"role": "passive", "data": str(out["host"])}})
    result = train_embedded(config, tmp_path / "run")
    assert result["n_aligned"] == truth
    assert 23_000 < truth < 27_000
    assert result["train_auc"] > 0.7
    model, _ = train_centralized(config)
    assert_same_trees(federated_view(tmp_path / "run", config), centralized_view(model))


# Everything the active party may send a passive party: blinded ids, the row alignment, the
# public key, ciphertexts, the splits it owns, instance spaces, and the (row, record) pairs on
# the hold-out rows' paths (path-mode validation).
ACTIVE_TO_PASSIVE = {MsgType.PSI_POINTS, MsgType.ALIGNED_ROWS, MsgType.PUBLIC_KEY,
                     MsgType.TREE_START, MsgType.ENCRYPTED_GRADIENTS, MsgType.SPLIT_CHOICES,
                     MsgType.NODE_POSITIONS, MsgType.DECISION_REQUEST}


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return [value]


@pytest.mark.parametrize("scheme", ["paillier", "ou"])
def test_privacy_of_every_message(tmp_path: Path, scheme: str) -> None:
    config = config_with("breast.yaml", crypto={"key_bits": 1024, "scheme": scheme})
    hub = MemoryHub(["guest", "host", FLOW_ENDPOINT], record=True, helpers={"host": 1})
    train_embedded(config, tmp_path, hub=hub)
    recorded = hub.recorded()
    model = load_model(tmp_path / "guest" / "model.json")
    leaf_values = {n.value for t in model.trees for n in t.nodes if n.is_leaf}
    n = int.from_bytes(next(_envelope(d).body.n for s, r, d in recorded
                            if _envelope(d).kind == MsgType.PUBLIC_KEY), "big")
    assert len(recorded) > 100
    kinds_to_host = set()
    for sender, recipient, data in recorded:
        env = _envelope(data)
        raw = msgpack.unpackb(msgpack.unpackb(data)["envelope"], raw=False)["body"]
        values = _leaves(raw)
        # no message carries a factor of n (the private key), whole or as a 64/128-byte word
        # (or, under OU, a word as wide as p: n = p^2 q, p of a third of n's bits)
        widths = (64, 128) if scheme == "paillier" else (64, 128, (n.bit_length() // 3 + 7) // 8)
        for v in values:
            candidates = [v] if isinstance(v, int) and not isinstance(v, bool) else []
            if isinstance(v, bytes):
                candidates.append(int.from_bytes(v, "big"))
                for width in widths:
                    candidates += [int.from_bytes(v[i:i + width], "big")
                                   for i in range(0, len(v) - width + 1, width)]
            for c in candidates:
                assert math.gcd(c, n) in (1, n) or c == 0, f"{env.kind.name} leaks a factor of n"
        if recipient == FLOW_ENDPOINT:  # small control replies: no ciphertext, key or data
            assert not any(isinstance(v, bytes) and len(v) >= 64 for v in values), env.kind.name
        if recipient != "host":
            continue
        kinds_to_host.add(env.kind)
        if sender == "guest":
            assert env.kind in ACTIVE_TO_PASSIVE, env.kind
            assert not any(isinstance(v, float) for v in values), f"{env.kind.name} has a float"
        assert not leaf_values & {v for v in values if isinstance(v, float)}, "leaf value leaked"
        if env.kind == MsgType.ENCRYPTED_GRADIENTS:
            blob = env.body.ciphertexts
            if scheme == "paillier":
                cts = [int.from_bytes(blob[i:i + 256], "big") for i in range(0, len(blob), 256)]
                assert all(n < c < n * n for c in cts), "gradients must travel as ciphertexts"
            else:  # residues modulo n, not plaintexts (those stay below p, 341 bits)
                cts = [int.from_bytes(blob[i:i + 128], "big") for i in range(0, len(blob), 128)]
                assert len(blob) % 128 == 0 and all(2**512 < c < n for c in cts), \
                    "gradients must travel as ciphertexts"
    assert {MsgType.ENCRYPTED_GRADIENTS, MsgType.NODE_POSITIONS} <= kinds_to_host
    assert MsgType.TREE_FINISHED not in kinds_to_host
    assert MsgType.DECISION_REQUEST in kinds_to_host  # validation scored in path mode
    # the active party's part shows the passive party's splits as records only
    host_nodes = [node for t in model.trees for node in t.nodes if node.owner == "host"]
    assert host_nodes and all(node.feature == -1 and math.isnan(node.threshold)
                              and node.record_id >= 0 for node in host_nodes)
    # the passive party's saved part holds lookup records only
    host_files = {p.name for p in (tmp_path / "host").iterdir()}
    assert host_files == {"lookup.json", "party.json"}
    assert "value" not in (tmp_path / "host" / "lookup.json").read_text()
    assert json.loads((tmp_path / "host" / "lookup.json").read_text())["records"]
