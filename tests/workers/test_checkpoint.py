"""Checkpoint files: atomic, private, two kept, never mixed across jobs, data or runs."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from messages.bodies import Checkpoint
from workers import checkpoint
from workers.checkpoint import CheckpointError


def test_newest_two_kept_private_and_read_back(tmp_path: Path) -> None:
    for trees in range(4):
        path = checkpoint.save(tmp_path, trees, "spec", "run-a", {"trees": trees})
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # may hold the private key
    assert checkpoint.available(tmp_path, "spec") == [Checkpoint(2, "run-a"), Checkpoint(3, "run-a")]
    assert checkpoint.load(tmp_path, Checkpoint(3, "run-a"), "spec") == {"trees": 3}
    assert checkpoint.available(tmp_path, "other spec or data") == []
    with pytest.raises(CheckpointError, match="another job spec, data file or run"):
        checkpoint.load(tmp_path, Checkpoint(3, "run-b"), "spec")
    with pytest.raises(CheckpointError, match="no checkpoint after 1 trees"):
        checkpoint.load(tmp_path, Checkpoint(1, "run-a"), "spec")


def test_damaged_and_half_written_files_are_never_offered(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 0, "spec", "run-a", {"trees": 0})
    newest = checkpoint.save(tmp_path, 1, "spec", "run-a", {"trees": 1})
    newest.write_bytes(newest.read_bytes()[:-10])  # truncated (disk full, copied badly)
    assert checkpoint.available(tmp_path, "spec") == [Checkpoint(0, "run-a")]
    with pytest.raises(CheckpointError, match="damaged"):
        checkpoint.load(tmp_path, Checkpoint(1, "run-a"), "spec")
    partial = tmp_path / checkpoint.FOLDER / "trees-000002.tmp"  # a worker killed mid-save
    partial.write_bytes(b"half")
    checkpoint.save(tmp_path, 2, "spec", "run-a", {"trees": 2})
    assert not partial.exists() or partial.read_bytes() != b"half"
    partial.write_bytes(b"half")
    checkpoint.discard(tmp_path)
    assert not (tmp_path / checkpoint.FOLDER).exists()


def test_a_checkpoint_of_another_layout_is_never_unpickled(tmp_path: Path) -> None:
    path = checkpoint.save(tmp_path, 1, "spec", "run-a", {"trees": 1})
    older = b"fedboost-checkpoint-1\n"  # same length, an earlier state layout
    path.write_bytes(older + path.read_bytes()[len(checkpoint.MAGIC):])

    assert checkpoint.available(tmp_path, "spec") == []
    with pytest.raises(CheckpointError, match="another fedboost version"):
        checkpoint.load(tmp_path, Checkpoint(1, "run-a"), "spec")


def test_runs_are_told_apart_by_their_key() -> None:
    assert checkpoint.run_of(2**2047 + 1) != checkpoint.run_of(2**2047 + 3)
    assert checkpoint.run_of(12345) == checkpoint.run_of(12345)
