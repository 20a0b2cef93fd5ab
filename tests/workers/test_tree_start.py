"""A passive party starts a tree as soon as all its gradients are in: the coordinating process
parses them and its helpers hold them before the tree's first histograms are asked for. Bad
gradients are left for that step, which answers them with an error."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from boosting.fixedpoint import value_bits
from crypto.paillier import (PaillierPrivateKey, PaillierPublicKey, ciphertexts_to_bytes,
                             generate_keypair)
from messages.bodies import ErrorReply, PartyInfo, Step
from messages.secureboost import EncryptedGradients, JobSpec, OpenJob, TreeStart
from messages.envelope import Envelope, Kind, MsgType
from messages.instance_space import encode_mask
from messages.signing import Sealer, federation_sealers
from messages.transport import MemoryHub
from messages.params import TreeParams
from tests.scenarios import DATA, TEST_POLICY
from workers import checkpoint, shards
from workers.party import PartySpec
from workers.protocols import PROTOCOLS
from workers.runtime import Worker
from workers.vertical.passive import PassiveTraining

SEALERS = federation_sealers(["guest", "host"])
ROWS = 40
SPEC = JobSpec([PartyInfo("guest", "active"), PartyInfo("host", "passive")],
               TreeParams(n_trees=2, max_depth=3), False, 1024, 0.0, 0, "y")


@pytest.fixture(scope="module")
def keypair() -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    return generate_keypair(1024)


def _host(tmp_path: Path, public: PaillierPublicKey,
          helpers: int = 1) -> tuple[Worker, Worker, MemoryHub]:
    """A host coordinator with an open job whose features are binned, and a helper (with
    ``helpers`` 0 the coordinator alone, and the helper returned is the coordinator)."""
    hub = MemoryHub(["host", "guest", "flow"], helpers={"host": helpers} if helpers else None)
    party = PartySpec("host", "passive", str(DATA / "breast_hetero_host.csv"), "id", None,
                      str(tmp_path), processes=1 + min(helpers, 1), policy=TEST_POLICY)
    coordinator = Worker(party, hub.endpoint("host"), PROTOCOLS, SEALERS["host"])
    own = SEALERS["host"]  # each process has its own copy of the key (and of what it has seen)
    helper = coordinator if not helpers else Worker(
        party, hub.endpoint("host", helper=True), PROTOCOLS,
        Sealer(own.identity, own.private, dict(own.trusted)))
    coordinator.handle_bytes(SEALERS["flow"].seal(
        Envelope("job", "s/open", "flow", "host", MsgType.OPEN_JOB, OpenJob(SPEC))))
    assert hub.endpoint("flow").receive(timeout=5) is not None  # OPENED
    state = coordinator.jobs["job"].state
    state.bins = np.random.default_rng(0).integers(0, 33, size=(ROWS, 3), dtype=np.uint8)
    state.role_state.public = public
    return coordinator, helper, hub


def _from_guest(kind: Kind, body: object, tree: int = 0) -> bytes:
    return SEALERS["guest"].seal(Envelope("job", f"s/encrypt_gradients/t{tree}", "guest",
                                          "host", kind, body))


def _gradients(public: PaillierPublicKey, private: PaillierPrivateKey,
               rows: int = ROWS, per_ciphertext: int = 1,
               tree: int = 0) -> tuple[bytes, list[bytes]]:
    blob = ciphertexts_to_bytes(private.encrypt_batch(list(range(1, rows + 1))), public)
    half = (rows // 2) * public.ciphertext_bytes
    start = TreeStart(tree=tree, in_tree=encode_mask(np.ones(ROWS, dtype=bool)), n_chunks=2,
                      value_bits=value_bits(ROWS), max_rows=ROWS,
                      per_ciphertext=per_ciphertext)
    return (_from_guest(MsgType.TREE_START, start, tree),
            [_from_guest(MsgType.ENCRYPTED_GRADIENTS, EncryptedGradients(tree, k, part), tree)
             for k, part in enumerate((blob[:half], blob[half:]))])


def _finish(coordinator: Worker, hub: MemoryHub, tree: int) -> object:
    """The flow's drop of ``tree`` (FINISH_TREE); the body the party answers with."""
    coordinator.handle_bytes(SEALERS["flow"].seal(Envelope(
        "job", f"s/finish_tree/t{tree}", "flow", "host", MsgType.FINISH_TREE, Step(tree))))
    data = hub.endpoint("flow").receive(timeout=5)
    assert data is not None
    return SEALERS["flow"].open(data).body


def test_the_drop_of_a_tree_sat_out_may_come_after_the_next_trees_gradients(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    """Completely SecureBoost: the party took no part in tree 0, the flow's drop of it runs
    beside tree 1's gradients, which come straight from the active party and may start tree 1
    first (a CI run failed the vehicle job on it: 'finish_tree t3: party is at t4'). The drop
    is taken, tree 1 keeps its ciphertexts, the checkpoint counts one tree; a drop two trees
    behind is still refused."""
    public, private = keypair
    coordinator, _, hub = _host(tmp_path, public, helpers=0)
    run: PassiveTraining = coordinator.jobs["job"].state.role_state
    start, chunks = _gradients(public, private, tree=1)
    for message in (start, *chunks):
        coordinator.handle_bytes(message)
    assert run.tree == 1 and run.growing and len(run.tree_ciphertexts) == ROWS

    reply = _finish(coordinator, hub, 0)
    assert not isinstance(reply, ErrorReply), reply
    assert run.tree == 1 and run.growing and len(run.tree_ciphertexts) == ROWS
    state = coordinator.jobs["job"].state
    held = checkpoint.available(coordinator.party.model_folder("job"), state.digest,
                                checkpoint.key_of(coordinator.party))
    assert max(c.trees_done for c in held) == 1  # a point to resume from after tree 0

    coordinator2, _, hub2 = _host(tmp_path / "two-behind", public, helpers=0)
    start, chunks = _gradients(public, private, tree=2)
    for message in (start, *chunks):
        coordinator2.handle_bytes(message)
    reply = _finish(coordinator2, hub2, 0)
    assert isinstance(reply, ErrorReply) and "party is at t2" in reply.message


def test_chunks_reach_the_helpers_as_they_arrive_and_the_last_one_starts_the_tree(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    coordinator, helper, hub = _host(tmp_path, public)
    run: PassiveTraining = coordinator.jobs["job"].state.role_state
    start, chunks = _gradients(public, private)
    work = hub.endpoint("host", helper=True)

    coordinator.handle_bytes(start)
    coordinator.handle_bytes(chunks[0])
    assert run.tree == -1  # one chunk still to come...
    first = work.receive(timeout=5)  # ...but the helper has the first one already
    assert first is not None
    coordinator.handle_bytes(chunks[1])
    assert run.tree == 0 and len(run.tree_ciphertexts) == ROWS
    assert not coordinator.jobs["job"].mailbox.items  # taken: the tree's first step is ready
    second = work.receive(timeout=5)
    assert second is not None

    for handed in (second, first):
        envelope = Sealer(SEALERS["host"].identity, SEALERS["host"].private,
                          dict(SEALERS["host"].trusted)).open(handed)
        assert envelope.kind == MsgType.TREE_CIPHERTEXTS and envelope.body.n_chunks == 2
        helper.handle_bytes(handed)  # keeps the chunk, and answers nothing
    assert hub.endpoint("host").receive(timeout=0.2) is None
    # named by the digest of the tree's chunks in order, hashed as they came
    assert run.tree_digest == hashlib.sha256(ciphertexts_to_bytes(run.tree_ciphertexts,
                                                                  public)).digest()
    assert shards._TREE_CIPHERTEXTS[(run.tree_digest, envelope.body.n)] == run.tree_ciphertexts


def test_with_two_helpers_the_trees_first_level_brings_the_tree(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    coordinator, _, hub = _host(tmp_path, public, helpers=2)
    run: PassiveTraining = coordinator.jobs["job"].state.role_state
    start, chunks = _gradients(public, private)
    work = hub.endpoint("host", helper=True)

    for message in (start, *chunks):
        coordinator.handle_bytes(message)
    assert run.tree == 0
    assert work.receive(timeout=0.3) is None  # copies of chunks could all go to one helper

    coordinator.handle_bytes(SEALERS["flow"].seal(Envelope(
        "job", "s/build_histograms/t0/d0", "flow", "host", MsgType.BUILD_HISTOGRAMS, Step(0, 0))))
    own = SEALERS["host"]
    opener = Sealer(own.identity, own.private, dict(own.trusted))
    shards_out = [opener.open(data) for data in (work.receive(timeout=5), work.receive(timeout=5))
                  if data is not None]
    assert [s.body.shard for s in shards_out] == [1, 2]
    whole = b"".join(run.chunks)  # kept, with two helpers, for the first level's shards
    assert all(s.body.tree_ciphertexts == whole for s in shards_out)
    assert all(s.body.tree_digest == hashlib.sha256(whole).digest() == run.tree_digest
               for s in shards_out)


def test_bad_gradients_are_answered_by_the_trees_first_step(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    coordinator, _, hub = _host(tmp_path, public)
    run: PassiveTraining = coordinator.jobs["job"].state.role_state
    start, chunks = _gradients(public, private, rows=ROWS - 1)  # one ciphertext short

    for message in (start, *chunks):
        coordinator.handle_bytes(message)
    assert run.tree == -1

    assert f"{ROWS - 1} ciphertexts for {ROWS} rows" in _first_level_error(coordinator, hub)


@pytest.mark.parametrize("per_ciphertext", [0, 5, 10])
def test_a_packing_but_one_sum_or_as_many_as_fit_is_refused(
        tmp_path: Path, keypair: tuple[PaillierPublicKey, PaillierPrivateKey],
        per_ciphertext: int) -> None:
    # 42-bit values over 40 rows: 103-bit bin sums, of which 9 fit a 1024-bit key
    public, private = keypair
    coordinator, _, hub = _host(tmp_path, public)
    start, chunks = _gradients(public, private, per_ciphertext=per_ciphertext)

    for message in (start, *chunks):
        coordinator.handle_bytes(message)
    assert f"asked to pack {per_ciphertext} bin sums per ciphertext; 1 (the key holder " \
        f"folds) or 9" in _first_level_error(coordinator, hub)


def _first_level_error(coordinator: Worker, hub: MemoryHub) -> str:
    """Ask for the tree's first histograms; the error the step answers with."""
    coordinator.handle_bytes(SEALERS["flow"].seal(Envelope(
        "job", "s/build_histograms/t0/d0", "flow", "host", MsgType.BUILD_HISTOGRAMS, Step(0, 0))))
    data = hub.endpoint("flow").receive(timeout=5)
    assert data is not None
    reply = SEALERS["flow"].open(data)
    assert isinstance(reply.body, ErrorReply)
    return reply.body.message
