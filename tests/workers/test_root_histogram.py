"""A passive party sums each gradient chunk into the root's histograms as it lands
(``workers.vertical.root_histogram``): in any order and any chunking, the root's bin products
are those of one pass over the in-tree rows; a chunk that cannot be where it says is refused;
the party's helpers are counted once a tree, not once a chunk and a level (over a WAN each
count is a round trip to the broker)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boosting.fixedpoint import value_bits
from crypto.bin_products import bin_products
from crypto.paillier import (PaillierPrivateKey, PaillierPublicKey, ciphertexts_to_bytes,
                             generate_keypair)
from messages.bodies import Step
from messages.envelope import Envelope, MsgType
from messages.instance_space import encode_mask
from messages.secureboost import EncryptedGradients, TreeStart
from tests.scenarios import TEST_POLICY
from tests.workers.test_tree_start import ROWS, SEALERS, _from_guest, _host
from workers import ProtocolError
from workers.vertical.passive import PassiveTraining
from workers.vertical.root_histogram import add_chunks, check_tree_start, in_order

N_BINS = 5
KEYS = generate_keypair(512)  # small: only products are compared, nothing is decrypted


@pytest.fixture(scope="module")
def keypair() -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    return generate_keypair(1024)


def _chunked(public: PaillierPublicKey, private: PaillierPrivateKey, in_tree: np.ndarray,
             size: int, tree: int = 0) -> tuple[TreeStart, list[EncryptedGradients], list]:
    """The in-tree rows' ciphertexts in chunks of ``size`` (the last shorter), as the active
    party sends them, and the ciphertexts in row order."""
    ciphertexts = private.encrypt_batch([int(v) for v in range(1, int(in_tree.sum()) + 1)])
    chunks = [EncryptedGradients(tree, k, ciphertexts_to_bytes(ciphertexts[i:i + size], public))
              for k, i in enumerate(range(0, len(ciphertexts), size))]
    start = TreeStart(tree=tree, in_tree=encode_mask(in_tree), n_chunks=len(chunks),
                      value_bits=value_bits(in_tree.size), max_rows=in_tree.size,
                      per_ciphertext=1)
    return start, chunks, ciphertexts


def _arrival(start: TreeStart, public: PaillierPublicKey, bins: np.ndarray):  # noqa: ANN202
    arrival = check_tree_start(start, bins.shape[0], public, False,
                               TEST_POLICY, "host")
    arrival.root_sums = [1] * (bins.shape[1] * N_BINS)  # type: ignore[list-item]
    return arrival


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(2, 40), features=st.integers(1, 4), size=st.integers(1, 12),
       data=st.data())
def test_the_root_summed_chunk_by_chunk_in_any_order_is_the_one_pass(
        rows: int, features: int, size: int, data: st.DataObject) -> None:
    public, private = KEYS
    in_tree = np.array(data.draw(st.lists(st.booleans(), min_size=rows, max_size=rows)))
    in_tree[data.draw(st.integers(0, rows - 1))] = True  # at least one row in the tree
    bins = np.array(data.draw(st.lists(st.integers(0, N_BINS - 1), min_size=rows * features,
                                       max_size=rows * features)),
                    dtype=np.uint8).reshape(rows, features)
    start, chunks, ciphertexts = _chunked(public, private, in_tree, size)
    arrival = _arrival(start, public, bins)
    order = data.draw(st.permutations(chunks))
    cut = data.draw(st.integers(0, len(order)))
    add_chunks(arrival, list(order[:cut]), bins, public, N_BINS)  # some as they arrive...
    add_chunks(arrival, list(order), bins, public, N_BINS)  # ...the rest (and again) later

    one_pass = bin_products(bins[in_tree], np.arange(len(ciphertexts)), ciphertexts, N_BINS,
                            public.cipher_modulus)
    assert arrival.root_sums == one_pass
    assert in_order(arrival) == ciphertexts


def test_a_chunk_that_cannot_be_where_it_says_is_refused() -> None:
    public, private = KEYS
    in_tree = np.ones(10, dtype=bool)
    bins = np.zeros((10, 2), dtype=np.uint8)
    start, chunks, _ = _chunked(public, private, in_tree, 4)  # 4 + 4 + 2
    uneven = EncryptedGradients(0, 1, chunks[1].ciphertexts[:3 * public.ciphertext_bytes])
    arrival = _arrival(start, public, bins)
    add_chunks(arrival, [chunks[0]], bins, public, N_BINS)
    with pytest.raises(ProtocolError, match="chunk 1 holds 3 ciphertexts, an earlier one 4"):
        add_chunks(arrival, [uneven], bins, public, N_BINS)
    with pytest.raises(ProtocolError, match="gradient chunk 3 of 3"):
        add_chunks(arrival, [EncryptedGradients(0, 3, chunks[2].ciphertexts)], bins, public,
                   N_BINS)
    long_last = EncryptedGradients(0, 2, chunks[0].ciphertexts * 3)
    with pytest.raises(ProtocolError, match="does not fit 10 in-tree rows"):
        add_chunks(arrival, [long_last], bins, public, N_BINS)
    # chunks of one size whose last does not end where the others leave off
    short = _arrival(start, public, bins)
    add_chunks(short, [chunks[0], chunks[1]], bins, public, N_BINS)
    add_chunks(short, [EncryptedGradients(0, 2, chunks[2].ciphertexts[:public.ciphertext_bytes])],
               bins, public, N_BINS)
    with pytest.raises(ProtocolError, match="9 ciphertexts for 10 rows"):
        in_order(short)


def test_without_helpers_the_roots_sums_are_ready_when_the_last_chunk_lands_and_helpers_are_counted_once(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    coordinator, _, hub = _host(tmp_path, public, helpers=0)
    state = coordinator.jobs["job"].state
    run: PassiveTraining = state.role_state
    endpoint = coordinator.transport
    asked = []
    counted = endpoint.helpers
    endpoint.helpers = lambda: asked.append(1) or counted()  # type: ignore[method-assign]
    start, chunks, ciphertexts = _chunked(public, private, np.ones(ROWS, dtype=bool), 8)

    coordinator.handle_bytes(_from_guest(MsgType.TREE_START, start))
    for chunk in chunks:
        coordinator.handle_bytes(_from_guest(MsgType.ENCRYPTED_GRADIENTS, chunk))
    assert run.tree == 0 and run.root_sums is not None  # summed before its step is asked
    n_bins = run.params.max_bin + 1
    assert run.root_sums == bin_products(state.bins, np.arange(ROWS), ciphertexts, n_bins,
                                         public.cipher_modulus)
    coordinator.handle_bytes(SEALERS["flow"].seal(Envelope(
        "job", "s/build_histograms/t0/d0", "flow", "host", MsgType.BUILD_HISTOGRAMS, Step(0, 0))))
    replies = [hub.endpoint(who).receive(timeout=5) for who in ("guest", "flow")]
    assert all(r is not None for r in replies)
    assert run.root_sums is None  # packed and sent
    assert len(asked) == 1, f"helpers counted {len(asked)} times for one tree's {len(chunks)} chunks"
