"""Checkpoint files: atomic, private, two kept, never mixed across jobs, data or runs;
authenticated under the party's own key before anything in them is parsed; never a pickle."""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import stat
from pathlib import Path

import msgpack
import numpy as np
import pytest

from boosting.params import BoostParams
from boosting.tree import Tree, TreeNode
from crypto.encoding import GradientPacker
from messages.bodies import Checkpoint, Metric, TreeFinished
from workers import checkpoint
from workers._state_codec import pack
from workers.checkpoint import CheckpointError
from workers.column_partitioned.lookup import LookupRecord
from workers.data import PartyData
from workers.horizontal.member_state import MemberRecord
from workers.state import JobState
from workers.vertical.active_state import ActiveTraining
from workers.vertical.passive import PassiveTraining

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


class _RunsCode:
    """What a planted pickle would do when loaded: leave a file behind."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.write_text, (self.marker, "pickle ran in the worker"))


def old_pickled_checkpoint(marker: Path, version: int = 2) -> bytes:
    """A checkpoint as fedboost wrote them before format 3 (intact, so it would have been
    unpickled), whose state runs code when loaded."""
    payload = pickle.dumps({"digest": "spec", "trees_done": 1, "run": "run-a",
                            "state": _RunsCode(marker)})
    return (f"fedboost-checkpoint-{version}\n".encode() + hashlib.sha256(payload).digest()
            + payload)


def test_newest_two_kept_private_and_read_back(tmp_path: Path) -> None:
    for trees in range(4):
        path = checkpoint.save(tmp_path, trees, "spec", "run-a", {"trees": trees}, KEY)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # may hold the private key
        assert path.read_bytes().startswith(checkpoint.MAGIC)
    assert checkpoint.available(tmp_path, "spec", KEY) == [Checkpoint(2, "run-a"),
                                                           Checkpoint(3, "run-a")]
    assert checkpoint.load(tmp_path, Checkpoint(3, "run-a"), "spec", KEY) == {"trees": 3}
    assert checkpoint.available(tmp_path, "other spec or data", KEY) == []
    with pytest.raises(CheckpointError, match="another job spec, data file or run"):
        checkpoint.load(tmp_path, Checkpoint(3, "run-b"), "spec", KEY)
    with pytest.raises(CheckpointError, match="no checkpoint after 1 trees"):
        checkpoint.load(tmp_path, Checkpoint(1, "run-a"), "spec", KEY)


def test_a_renamed_checkpoint_is_not_taken_for_another_tree(tmp_path: Path) -> None:
    path = checkpoint.save(tmp_path, 3, "spec", "run-a", {"trees": 3}, KEY)
    path.rename(path.with_name("trees-000002.ckpt"))
    with pytest.raises(CheckpointError, match="another job spec, data file or run"):
        checkpoint.load(tmp_path, Checkpoint(2, "run-a"), "spec", KEY)


def test_damaged_and_half_written_files_are_never_offered(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 0, "spec", "run-a", {"trees": 0}, KEY)
    newest = checkpoint.save(tmp_path, 1, "spec", "run-a", {"trees": 1}, KEY)
    newest.write_bytes(newest.read_bytes()[:-10])  # truncated (disk full, copied badly)
    assert checkpoint.available(tmp_path, "spec", KEY) == [Checkpoint(0, "run-a")]
    with pytest.raises(CheckpointError, match="authentication tag"):
        checkpoint.load(tmp_path, Checkpoint(1, "run-a"), "spec", KEY)
    partial = tmp_path / checkpoint.FOLDER / "trees-000002.tmp"  # a worker killed mid-save
    partial.write_bytes(b"half")
    checkpoint.save(tmp_path, 2, "spec", "run-a", {"trees": 2}, KEY)
    assert not partial.exists() or partial.read_bytes() != b"half"
    partial.write_bytes(b"half")
    checkpoint.discard(tmp_path)
    assert not (tmp_path / checkpoint.FOLDER).exists()


@pytest.mark.parametrize("where", [0, len(checkpoint.MAGIC), len(checkpoint.MAGIC) + 40, -1])
def test_one_flipped_byte_anywhere_is_refused(tmp_path: Path, where: int) -> None:
    path = checkpoint.save(tmp_path, 1, "spec", "run-a", {"trees": np.arange(5)}, KEY)
    raw = bytearray(path.read_bytes())
    raw[where] ^= 0x01
    path.write_bytes(bytes(raw))
    assert checkpoint.available(tmp_path, "spec", KEY) == []
    with pytest.raises(CheckpointError, match="refused"):
        checkpoint.load(tmp_path, Checkpoint(1, "run-a"), "spec", KEY)


def test_a_valid_looking_file_with_a_wrong_tag_is_refused(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Well-formed msgpack of the right layout after the right magic, but no valid tag."""
    payload = pack({"digest": "spec", "trees_done": 1, "run": "run-a", "state": {"trees": 1}}, {})
    folder = tmp_path / checkpoint.FOLDER
    folder.mkdir()
    (folder / "trees-000001.ckpt").write_bytes(checkpoint.MAGIC + b"\0" * 32 + payload)
    assert checkpoint.available(tmp_path, "spec", KEY) == []
    assert "trees-000001.ckpt does not carry this party's authentication tag" in caplog.text
    with pytest.raises(CheckpointError, match="authentication tag"):
        checkpoint.load(tmp_path, Checkpoint(1, "run-a"), "spec", KEY)


def test_a_checkpoint_copied_from_another_party_is_refused(tmp_path: Path) -> None:
    theirs = checkpoint.save(tmp_path / "guest", 1, "spec", "run-a", {"trees": 1}, OTHER_KEY)
    ours = tmp_path / "host" / checkpoint.FOLDER
    ours.mkdir(parents=True)
    (ours / theirs.name).write_bytes(theirs.read_bytes())
    assert checkpoint.available(tmp_path / "host", "spec", KEY) == []
    with pytest.raises(CheckpointError, match="another party's key"):
        checkpoint.load(tmp_path / "host", Checkpoint(1, "run-a"), "spec", KEY)


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_pickled_checkpoint_is_refused_by_name_never_unpickled(tmp_path: Path,
                                                                       version: int) -> None:
    marker = tmp_path / "pwned"
    folder = tmp_path / "job" / checkpoint.FOLDER
    folder.mkdir(parents=True)
    (folder / "trees-000001.ckpt").write_bytes(old_pickled_checkpoint(marker, version))

    assert checkpoint.available(tmp_path / "job", "spec", KEY) == []
    with pytest.raises(CheckpointError, match=f"format '{version}'.*pickles.*never read"):
        checkpoint.load(tmp_path / "job", Checkpoint(1, "run-a"), "spec", KEY)
    assert not marker.exists()


def test_a_checkpoint_of_the_previous_wire_version_is_refused_in_one_line(tmp_path: Path) -> None:
    """Format 3 was written under wire version 4 (tree parameters flat in the job spec): even
    intact and under this party's key it is refused, naming why, and never offered."""
    payload = msgpack.packb({"digest": "spec", "trees_done": 1, "run": "run-a", "state": None})
    old = b"fedboost-checkpoint-3\n"
    mac = hmac.new(KEY, old, hashlib.sha256)
    mac.update(payload)
    folder = tmp_path / "job" / checkpoint.FOLDER
    folder.mkdir(parents=True)
    (folder / "trees-000001.ckpt").write_bytes(old + mac.digest() + payload)

    assert checkpoint.available(tmp_path / "job", "spec", KEY) == []
    with pytest.raises(CheckpointError) as refused:
        checkpoint.load(tmp_path / "job", Checkpoint(1, "run-a"), "spec", KEY)
    assert "\n" not in str(refused.value)
    assert "format '3', written by an older fedboost (before wire version 5): refused" in str(
        refused.value)


def test_a_tagged_file_naming_a_type_outside_the_allowlist_is_refused(tmp_path: Path) -> None:
    """Even under the party's own key, a name read from the file is never imported or called."""
    evil = msgpack.ExtType(6, msgpack.packb(["os.system", {"command": "touch pwned"}]))
    payload = msgpack.packb({"digest": "spec", "trees_done": 1, "run": "run-a", "state": evil})
    folder = tmp_path / checkpoint.FOLDER
    folder.mkdir()
    path = folder / "trees-000001.ckpt"
    path.write_bytes(checkpoint.MAGIC + checkpoint._tag(KEY, payload) + payload)
    with pytest.raises(CheckpointError, match="'os.system' is not allowed"):
        checkpoint.load(tmp_path, Checkpoint(1, "run-a"), "spec", KEY)


def test_the_party_key_is_made_once_private_and_kept(tmp_path: Path) -> None:
    private = tmp_path / ".fedboost" / "host"
    private.mkdir(parents=True, mode=0o700)
    key = checkpoint.party_key(private)
    assert len(key) == 32 and checkpoint.party_key(private) == key
    assert stat.S_IMODE((private / checkpoint.KEY_FILE).stat().st_mode) == 0o600
    assert os.listdir(private) == [checkpoint.KEY_FILE]  # no temporary file left
    (private / checkpoint.KEY_FILE).write_bytes(b"short")
    with pytest.raises(CheckpointError, match="checkpoint.key is damaged"):
        checkpoint.party_key(private)


def _job_state(role_state: object) -> JobState:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(20, 3))
    x[3, 1] = np.nan
    return JobState(kind="train", party="guest", active="guest", passives=["host", "h2"],
                    data=PartyData(ids=[f"id{i}" for i in range(20)], names=("a", "b", "c"),
                                   x=x, y=rng.integers(0, 2, 20).astype(float)),
                    valid_fraction=0.2, valid_seed=3, key_bits=1024, psi=None,
                    psi_order=rng.permutation(20), aligned=np.arange(20),
                    valid=rng.random(20) < 0.2, cuts=[np.linspace(0, 1, 5)] * 3,
                    bins=np.asfortranarray(rng.integers(0, 5, (16, 3)).astype(np.uint8)),
                    score_x=x[:4], role_state=role_state, digest="d" * 64)


def test_an_active_state_with_its_private_key_round_trips(tmp_path: Path,
                                                          scheme_keypair) -> None:  # type: ignore[no-untyped-def]
    public, private = scheme_keypair  # Paillier, then Okamoto-Uchiyama
    node = TreeNode(0, 1, 2, "host", 1, 3, np.float64(0.25), True, 0, 0.0)
    run = ActiveTraining(params=BoostParams(n_trees=3, objective="multiclass"), public=public,
                         private=private, y=np.arange(16.0), n_classes=3,
                         base=np.zeros(3), margin=np.ones((16, 3)),
                         grads=(np.ones((16, 3)), np.full((16, 3), 0.5)),
                         packer=GradientPacker(value_bits=52, max_rows=16),
                         trees=[Tree((node, TreeNode(1, value=-0.5), TreeNode(2, value=0.5)), 1)],
                         history=[TreeFinished([Metric("logloss", 0.5)])])
    state = _job_state(run)
    checkpoint.save_job(tmp_path, 1, state, public.n, key=KEY, pool=None, grower=None)
    opened = _job_state(None)
    back = checkpoint.restore(tmp_path, Checkpoint(1, checkpoint.run_of(int(public.n))), opened,
                              KEY)

    got: ActiveTraining = back.role_state
    assert got.private.raw_decrypt(public.raw_encrypt(123456789)) == 123456789  # it works
    assert (got.private.p, got.private.q) == (private.p, private.q)
    assert type(got.private) is type(private) and got.public == public
    assert repr(got.trees) == repr(run.trees)  # leaves' thresholds are NaN: compare the text
    assert got.history == run.history and got.packer == run.packer
    assert type(got.trees[0].nodes[0].threshold) is np.float64
    for name in ("y", "base", "margin"):
        np.testing.assert_array_equal(getattr(got, name), getattr(run, name))
    assert all(np.array_equal(a, b) for a, b in zip(got.grads or (), run.grads or ()))
    assert back.bins is not None and back.bins.flags.f_contiguous and back.bins.dtype == np.uint8
    for name in ("psi_order", "aligned", "valid", "bins", "score_x"):
        np.testing.assert_array_equal(getattr(back, name), getattr(state, name))
    np.testing.assert_array_equal(back.data.x, state.data.x)
    assert (back.data.ids, back.data.names, back.psi) == (state.data.ids, state.data.names, None)


def test_a_passive_state_round_trips(tmp_path: Path, keypair_1024) -> None:  # type: ignore[no-untyped-def]
    public, _ = keypair_1024
    run = PassiveTraining(params=BoostParams(), public=public,
                          records={0: LookupRecord(1, 2, 0.5, False), 7: LookupRecord(0, 1, -1.0, True)},
                          enc_index=np.arange(5), in_tree=np.ones(5, dtype=bool))
    state = _job_state(run)
    checkpoint.save_job(tmp_path, 0, state, public.n, key=KEY, tree=-1)
    back = checkpoint.restore(tmp_path, Checkpoint(0, checkpoint.run_of(int(public.n))),
                              _job_state(None), KEY)
    assert back.role_state.records == run.records and back.role_state.public == public
    np.testing.assert_array_equal(back.role_state.in_tree, run.in_tree)


def test_state_classes_that_moved_module_keep_the_names_checkpoints_hold() -> None:
    """A checkpoint names each class by module and name: the active state and the lookup
    record moved module (issue 25's splits) and are still written and read as before."""
    names = checkpoint._state_types()
    assert names["workers.vertical.active.ActiveTraining"] is ActiveTraining
    assert names["workers.vertical.passive.LookupRecord"] is LookupRecord
    assert b"workers.vertical.passive.LookupRecord" in pack(LookupRecord(1, 2, 0.5, False), names)


def test_runs_are_told_apart_by_their_key() -> None:
    assert checkpoint.run_of(2**2047 + 1) != checkpoint.run_of(2**2047 + 3)
    assert checkpoint.run_of(12345) == checkpoint.run_of(12345)


def _horizontal_record(trees: int) -> MemberRecord:
    tree = Tree(nodes=(TreeNode(id=0, value=0.25),))
    return MemberRecord([np.array([0.5, 1.5])], -0.3, 1, np.full((4, 1), -0.3),
                        np.full((4, 1), -0.3), [tree] * trees,
                        [TreeFinished([Metric("auc", 0.75)])] * trees)


def test_a_protocols_record_comes_back_typed_and_checked(tmp_path: Path) -> None:
    """One idiom for every record: the class the protocol registered, its trees counted."""
    saved = _horizontal_record(2)
    checkpoint.save(tmp_path, 2, "spec", "run-a", saved, KEY)
    loaded = checkpoint.load_record(tmp_path, Checkpoint(2, "run-a"), "spec", KEY, MemberRecord,
                                    "alice")
    assert isinstance(loaded, MemberRecord) and repr(loaded.trees) == repr(saved.trees)  # nan != nan
    np.testing.assert_array_equal(loaded.margin, saved.margin)
    checkpoint.save(tmp_path, 3, "spec", "run-a", saved, KEY)  # says 3 trees, holds 2
    with pytest.raises(CheckpointError, match="alice: the checkpoint after 3 trees in .* is damaged"):
        checkpoint.load_record(tmp_path, Checkpoint(3, "run-a"), "spec", KEY, MemberRecord,
                               "alice")


def test_a_dict_checkpoint_from_before_the_records_still_resumes(tmp_path: Path) -> None:
    """Horizontal checkpoints of format 2 were dicts (before multiclass without ``classes``
    or ``round_margin``): they read as the record; format 1 is refused by name."""
    record = _horizontal_record(1)
    old = {"format": 2, "cuts": record.cuts, "base": record.base, "margin": record.margin,
           "trees": record.trees, "history": record.history}
    checkpoint.save(tmp_path, 1, "spec", "run-a", old, KEY)
    loaded = checkpoint.load_record(tmp_path, Checkpoint(1, "run-a"), "spec", KEY, MemberRecord,
                                    "alice", MemberRecord.older)
    assert (loaded.classes, repr(loaded.trees), loaded.base) == (1, repr(record.trees), record.base)
    np.testing.assert_array_equal(loaded.round_margin, record.margin)
    checkpoint.save(tmp_path, 1, "spec", "run-a", {**old, "format": 1}, KEY)
    with pytest.raises(CheckpointError, match=r"is of an older horizontal protocol \(cuts "
                                              r"from quantile summaries\): refused"):
        checkpoint.load_record(tmp_path, Checkpoint(1, "run-a"), "spec", KEY, MemberRecord,
                               "alice", MemberRecord.older)
