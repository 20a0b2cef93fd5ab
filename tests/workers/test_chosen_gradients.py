"""An active party that encrypts chosen values in place of gradients (outside the model).

The attack: whoever holds the active party's keys encrypts ``2**i`` for row i. Every bin sum
then decrypts to the bitmask of the bin's rows. Sent one per ciphertext (the key holder folds
them, ``crypto.pack_bin_sums: key_holder``), each sum is a whole plaintext: one level's
histograms are the passive party's binned matrix, with nothing unusual in its log. A passive
party cannot see what a ciphertext holds (range proofs would show it); what it controls is the
shape: it accepts only the gradients' honest width for its rows, and with
``policy.pack_bin_sums: [passive]`` it folds its sums itself under random high bits, so a
decryption shows only the bits honest sums fill.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from boosting.fixedpoint import value_bits
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.paillier import (PaillierPrivateKey, PaillierPublicKey, ciphertexts_from_bytes,
                             ciphertexts_to_bytes, generate_keypair)
from messages.bodies import ErrorReply, Step
from messages.secureboost import (EncryptedGradients, EncryptedHistograms, JobSpec, OpenJob,
                                  TreeStart)
from fedboost.embedded import embedded_policy
from fedboost.worker import policy_of
from flows.config import PolicyConfig
from flows.declared.secureboost import CryptoConfig
from messages.envelope import Envelope, Kind, MsgType
from messages.instance_space import decode_mask, encode_mask
from messages.transport import MemoryHub
from tests.scenarios import DATA, TEST_POLICY
from tests.workers.test_tree_start import ROWS, SEALERS, SPEC
from workers.party import PartySpec
from workers.policy import PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

FEATURES, N_BINS = 3, 33
CELL_BITS = GradientPacker(value_bits(ROWS), ROWS).cell_bits
MOST = BinSumPacking.for_key(CELL_BITS, 1024).per_ciphertext


@pytest.fixture(scope="module")
def keypair() -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    return generate_keypair(1024)


class Host:
    """A real passive worker with an open job and binned features; the test is the flow and
    the attacker, who holds the active party's signing key and its Paillier key."""

    def __init__(self, tmp_path: Path, public: PaillierPublicKey, policy: PartyPolicy,
                 spec: JobSpec = SPEC) -> None:
        self.hub = MemoryHub(["host", "guest", "flow"])
        party = PartySpec("host", "passive", str(DATA / "breast_hetero_host.csv"), "id", None,
                          str(tmp_path), policy=policy)
        self.worker = Worker(party, self.hub.endpoint("host"), PROTOCOLS, SEALERS["host"])
        self.tasks = 0
        self.opened = self.command(MsgType.OPEN_JOB, OpenJob(spec))
        if self.opened.kind != MsgType.OPENED:
            return
        state = self.worker.jobs["job"].state
        self.bins = np.random.default_rng(0).integers(0, N_BINS, size=(ROWS, FEATURES),
                                                      dtype=np.uint8)
        state.bins = self.bins
        state.role_state.public = public

    def command(self, kind: Kind, body: object) -> Envelope:
        self.tasks += 1
        self.worker.handle_bytes(SEALERS["flow"].seal(Envelope(
            "job", f"s/task{self.tasks}", "flow", "host", kind, body)))
        data = self.hub.endpoint("flow").receive(timeout=10)
        assert data is not None
        return SEALERS["flow"].open(data)

    def from_guest(self, kind: Kind, body: object) -> None:
        self.worker.handle_bytes(SEALERS["guest"].seal(Envelope(
            "job", f"s/peer{kind.name}", "guest", "host", kind, body)))

    def histograms(self) -> EncryptedHistograms:
        data = self.hub.endpoint("guest").receive(timeout=10)
        assert data is not None
        sent = SEALERS["guest"].open(data)
        assert sent.kind == MsgType.ENCRYPTED_HISTOGRAMS
        return sent.body


def _chosen_gradients(host: Host, keypair: tuple[PaillierPublicKey, PaillierPrivateKey],
                      tree: int, per_ciphertext: int, bits: int = value_bits(ROWS)) -> None:
    """Row i's "gradient" is the plaintext 2**i, declared in the honest shape."""
    public, private = keypair
    blob = ciphertexts_to_bytes(private.encrypt_batch([1 << i for i in range(ROWS)]), public)
    host.from_guest(MsgType.TREE_START, TreeStart(
        tree=tree, in_tree=encode_mask(np.ones(ROWS, dtype=bool)), n_chunks=1, value_bits=bits,
        max_rows=ROWS, per_ciphertext=per_ciphertext))
    host.from_guest(MsgType.ENCRYPTED_GRADIENTS, EncryptedGradients(tree, 0, blob))


def _plaintexts(msg: EncryptedHistograms, private: PaillierPrivateKey) -> list[int]:
    return [int(m) for m in private.decrypt_batch(ciphertexts_from_bytes(msg.ciphertexts,
                                                                         private.public_key))]


def test_single_bin_sums_of_chosen_plaintexts_are_the_passive_partys_binned_matrix(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    host = Host(tmp_path, keypair[0], TEST_POLICY)  # allows the key holder to fold (default)
    _chosen_gradients(host, keypair, tree=0, per_ciphertext=1)
    assert host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 0)).kind == MsgType.ACK
    msg = host.histograms()
    filled = np.flatnonzero(decode_mask(msg.filled, FEATURES * N_BINS))
    read = np.full((ROWS, FEATURES), -1)
    for cell, bitmask in zip(filled.tolist(), _plaintexts(msg, keypair[1]), strict=True):
        feature, bin_ = divmod(cell, N_BINS)
        read[[i for i in range(ROWS) if bitmask >> i & 1], feature] = bin_
    assert (read == host.bins).all()  # every cell of the matrix, from one level


def test_a_party_that_folds_its_own_sums_refuses_single_sums_and_shows_only_their_width(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    strict = policy_of(PolicyConfig(min_key_bits=1024, pack_bin_sums=["passive"]))  # worker file
    assert strict.pack_bin_sums == ("passive",)
    refused = Host(tmp_path / "open", keypair[0], strict).opened  # pack_bin_sums: key_holder
    assert isinstance(refused.body, ErrorReply)
    assert "refuses to send its bin sums for the key holder to fold (the job's " \
        "crypto.pack_bin_sums): its policy (pack_bin_sums) allows passive only" \
        in refused.body.message

    host = Host(tmp_path / "tree", keypair[0], strict, replace(SPEC, pack_bin_sums="passive"))
    assert host.opened.kind == MsgType.OPENED
    _chosen_gradients(host, keypair, tree=0, per_ciphertext=1)  # asked in the tree's start
    reply = host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 0))
    assert isinstance(reply.body, ErrorReply)
    assert "tree 0 asks for one bin sum per ciphertext" in reply.body.message
    assert host.hub.endpoint("guest").receive(timeout=0.2) is None  # nothing sent
    _chosen_gradients(host, keypair, tree=1, per_ciphertext=1, bits=500)  # wider sums
    reply = host.command(MsgType.BUILD_HISTOGRAMS, Step(1, 0))
    assert isinstance(reply.body, ErrorReply) and "gradients have 42 bits" in reply.body.message

    # still serving: the honest shape is summed, folded here, twice for the same level
    _chosen_gradients(host, keypair, tree=2, per_ciphertext=MOST)
    assert host.command(MsgType.BUILD_HISTOGRAMS, Step(2, 0)).kind == MsgType.ACK
    assert host.command(MsgType.BUILD_HISTOGRAMS, Step(2, 0)).kind == MsgType.ACK
    first, again = host.histograms(), host.histograms()
    n_sums = int(decode_mask(first.filled, FEATURES * N_BINS).sum())
    for k, (a, b) in enumerate(zip(_plaintexts(first, keypair[1]),
                                   _plaintexts(again, keypair[1]), strict=True)):
        width = min(MOST, n_sums - k * MOST) * CELL_BITS
        assert a % (1 << width) == b % (1 << width)  # the same sums...
        assert a >> width != b >> width  # ...under fresh random bits, never the whole plaintext


def test_a_default_policy_refuses_a_job_that_chooses_the_key_holders_fold(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey],
        caplog: pytest.LogCaptureFixture) -> None:
    # a worker file that says nothing of packing: the job cannot choose single sums for it
    default = policy_of(PolicyConfig(min_key_bits=1024))
    assert default.pack_bin_sums == PartyPolicy().pack_bin_sums == ("passive",)
    with caplog.at_level("WARNING", logger="fedboost.worker"):
        refused = Host(tmp_path / "open", keypair[0], default).opened  # job: key_holder
    assert isinstance(refused.body, ErrorReply)
    assert "party host refuses to send its bin sums for the key holder to fold (the job's " \
        "crypto.pack_bin_sums): its policy (pack_bin_sums) allows passive only; set the " \
        "job's crypto.pack_bin_sums: passive" in refused.body.message
    assert any("refused OPEN_JOB" in r.getMessage() and "pack_bin_sums" in r.getMessage()
               for r in caplog.records)  # the refusal is in the passive party's log

    # a job that says nothing of packing asks for the passive party's own fold
    assert CryptoConfig().pack_bin_sums == "passive"
    host = Host(tmp_path / "tree", keypair[0], default, replace(SPEC, pack_bin_sums="passive"))
    assert host.opened.kind == MsgType.OPENED  # the same worker file, the default job
    _chosen_gradients(host, keypair, tree=0, per_ciphertext=1)  # a tree asking single sums
    reply = host.command(MsgType.BUILD_HISTOGRAMS, Step(0, 0))
    assert isinstance(reply.body, ErrorReply) and "one bin sum per ciphertext" in reply.body.message
    _chosen_gradients(host, keypair, tree=1, per_ciphertext=MOST)  # still serving
    assert host.command(MsgType.BUILD_HISTOGRAMS, Step(1, 0)).kind == MsgType.ACK
    assert host.histograms().per_ciphertext == MOST
    # the embedded default, where one operator runs every party, still allows both
    assert embedded_policy().pack_bin_sums == ("key_holder", "passive")
