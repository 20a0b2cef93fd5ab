"""Sizes a peer declares are bounded by what the receiver knows before anything is allocated:
the active party bounds a passive party's feature count by the bin sums its ciphertexts carry;
a passive party bounds the active party's row count and chunks by its own rows."""

from __future__ import annotations

import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boosting.fixedpoint import quantize, value_bits
from boosting.grow import TreeGrower
from boosting.params import BoostParams
from boosting.privacy import PrivacyPlan
from crypto.encoding import GradientPacker
from crypto.paillier import PaillierPrivateKey, PaillierPublicKey, ciphertexts_to_bytes
from messages.bodies import ErrorReply, Step
from messages.secureboost import EncryptedHistograms, TreeStart
from messages.envelope import Envelope, MsgType
from messages.instance_space import GAPS, InstanceSpace, encode_mask
from tests.workers.test_tree_start import ROWS, SEALERS, _host
from workers import ProtocolError
from workers.vertical.active_state import ActiveTraining
from workers.vertical.decryption import decrypt_histograms


@pytest.fixture(scope="module")
def run(keypair_1024: tuple[PaillierPublicKey, PaillierPrivateKey]) -> ActiveTraining:
    public, private = keypair_1024
    active = ActiveTraining(params=BoostParams(max_bin=32), public=public, private=private)
    active.packer = GradientPacker(value_bits=20, max_rows=100)
    return active


def _histograms(run: ActiveTraining, n_features: int, depth: int = 0,
                ciphertexts: int = 1) -> EncryptedHistograms:
    """One ciphertext (one bin sum) declared as the histograms of ``n_features`` features: a
    run-length mask of a few bytes declares nodes x features x bins positions."""
    blob = ciphertexts_to_bytes(run.private.encrypt_batch([1] * ciphertexts), run.public)
    return EncryptedHistograms(tree=0, depth=depth, nodes=[0], n_features=n_features, n_bins=33,
                               shard_features=[n_features],
                               filled=InstanceSpace(n_features * 33, GAPS, b"\x01"),
                               per_ciphertext=1, ciphertexts=blob)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(n_features=st.one_of(st.integers(2, 10**6), st.integers(10**6, 2**62)))
def test_a_declared_feature_count_beyond_the_bin_sums_is_refused_before_allocating(
        run: ActiveTraining, n_features: int) -> None:
    msg = _histograms(run, n_features)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=f"declared {n_features} features at the root"):
            decrypt_histograms(run, msg, [0], "host")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024  # nothing sized by the declared count


def test_later_levels_must_declare_the_roots_feature_count(run: ActiveTraining) -> None:
    run.passive_features.clear()
    with pytest.raises(ProtocolError, match="at depth 1, None at the tree's root"):
        decrypt_histograms(run, _histograms(run, 1, depth=1), [0], "host")
    run.passive_features["host"] = 1
    with pytest.raises(ProtocolError, match="declared 5 features at depth 1, 1 at the"):
        decrypt_histograms(run, _histograms(run, 5, depth=1, ciphertexts=5), [0], "host")


def test_a_private_tree_of_no_rows_takes_empty_histograms_of_the_known_feature_count(
        keypair_1024: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    """Under DP a tree may be dealt no rows: its histograms carry no bin sum, so nothing in them
    bounds the declared feature count; it must be the one of an earlier root."""
    public, private = keypair_1024
    params = BoostParams(max_bin=32, reg_lambda=1.0)
    active = ActiveTraining(params=params, public=public, private=private,
                            privacy=PrivacyPlan(1.0, 4, 3, 4, 1.0, 1.0, 0.3))
    active.packer = GradientPacker(value_bits=20, max_rows=100)
    none = np.zeros(100, dtype=bool)
    active.grower = TreeGrower(params, quantize(np.zeros(100), 100), quantize(np.ones(100), 100),
                               none, 2)

    def empty(n_features: int, depth: int = 0) -> EncryptedHistograms:
        return EncryptedHistograms(tree=0, depth=depth, nodes=[0], n_features=n_features,
                                   n_bins=33, shard_features=[n_features],
                                   filled=InstanceSpace(n_features * 33, GAPS, b""),
                                   per_ciphertext=1, ciphertexts=b"")

    with pytest.raises(ProtocolError, match="of no rows; expected none, of the None features"):
        decrypt_histograms(active, empty(10**9), [0], "host")
    active.passive_features["host"] = 3
    assert not decrypt_histograms(active, empty(3), [0], "host").any()
    assert not decrypt_histograms(active, empty(3, depth=2), [0], "host").any()
    with pytest.raises(ProtocolError, match="expected none, of the 3 features"):
        decrypt_histograms(active, _histograms(active, 3), [0], "host")  # a bin sum: a lie
    active.grower = replace(active.grower, in_tree=~none)  # a tree with rows: as before
    with pytest.raises(ProtocolError, match="declared 3 features at the root, with 0 bin sums"):
        decrypt_histograms(active, empty(3), [0], "host")


@pytest.mark.parametrize("n_chunks, max_rows, refusal", [
    (10**9, ROWS, "this party has 40 rows"), (1, 10**12, "this party has 40 rows"),
    # no chunk: only for a private tree of no rows (test_split_limits)
    (0, ROWS, "only a job under differential privacy grows a tree of no rows")])
def test_a_passive_party_bounds_the_declared_rows_and_chunks_by_its_own(
        tmp_path: Path, keypair_1024: tuple[PaillierPublicKey, PaillierPrivateKey],
        n_chunks: int, max_rows: int, refusal: str) -> None:
    public, _ = keypair_1024
    worker, _, hub = _host(tmp_path, public)
    start = TreeStart(tree=0, in_tree=encode_mask(np.ones(ROWS, dtype=bool)), n_chunks=n_chunks,
                      value_bits=value_bits(ROWS), max_rows=max_rows)
    worker.handle_bytes(SEALERS["guest"].seal(Envelope("job", "s/t0", "guest", "host",
                                                       MsgType.TREE_START, start)))
    worker.handle_bytes(SEALERS["flow"].seal(Envelope(
        "job", "s/build_histograms/t0/d0", "flow", "host", MsgType.BUILD_HISTOGRAMS, Step(0, 0))))
    data = hub.endpoint("flow").receive(timeout=5)
    assert data is not None, "the step waited for chunks the party's rows cannot fill"
    reply = SEALERS["flow"].open(data)
    assert isinstance(reply.body, ErrorReply) and refusal in reply.body.message
