"""Model parts, lookup tables and scores are the party's alone: written 0600 whatever the umask, and
never through a symbolic link planted in the folder (issue 28, item 4)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from boosting.tree import open_private, write_json_atomic


def test_files_are_written_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)  # the loosest umask: files would come out 0666
    try:
        write_json_atomic(tmp_path / "model.json", {"trees": []})
        existing = tmp_path / "scores.csv"
        existing.write_text("left from before\n")
        existing.chmod(0o644)
        with open_private(existing) as handle:
            handle.write("id,score\n")
    finally:
        os.umask(old)
    for name in ("model.json", "scores.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    assert existing.read_text() == "id,score\n"


def _plant_link(at: Path, victim: Path) -> None:
    """Another local user's trap: ``at`` points to a file the party owns elsewhere."""
    victim.write_text("the party's other file\n")
    at.symlink_to(victim)


def test_a_link_planted_at_the_old_temporary_name_is_not_followed(tmp_path: Path) -> None:
    folder, victim = tmp_path / "model", tmp_path / "victim"
    folder.mkdir()
    _plant_link(folder / "lookup.json.tmp", victim)  # the name writers used before issue 28
    write_json_atomic(folder / "lookup.json", {"nodes": [1, 2]})
    assert victim.read_text() == "the party's other file\n"
    written = folder / "lookup.json"
    assert not written.is_symlink() and '"nodes"' in written.read_text()
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == ["lookup.json", "lookup.json.tmp"]


def test_a_link_planted_at_the_file_itself_is_replaced_not_written_through(tmp_path: Path) -> None:
    folder, victim = tmp_path / "model", tmp_path / "victim"
    folder.mkdir()
    _plant_link(folder / "model.json", victim)
    with open_private(folder / "model.json") as handle:
        handle.write("{}")
    assert victim.read_text() == "the party's other file\n"
    assert not (folder / "model.json").is_symlink() and (folder / "model.json").read_text() == "{}"


def test_a_link_at_a_guessed_temporary_name_is_refused_with_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The random temporary name guessed, or raced into place: the writer refuses it and
    writes nothing, through the link or anywhere else."""
    from boosting import tree

    folder, victim = tmp_path / "model", tmp_path / "victim"
    folder.mkdir()
    monkeypatch.setattr(tree.secrets, "token_hex", lambda _: "guessed")
    _plant_link(folder / ".scores.csv.guessed.tmp", victim)
    with pytest.raises(FileExistsError, match="planted link"):
        with open_private(folder / "scores.csv") as handle:
            handle.write("id,score\n")
    assert victim.read_text() == "the party's other file\n"
    assert (folder / ".scores.csv.guessed.tmp").is_symlink()  # left for the party to look at
    assert not (folder / "scores.csv").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "party.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with open_private(path) as handle:
            handle.write("half")
            raise RuntimeError("disk full")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["party.json"]


def test_without_replace_an_existing_file_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.key"
    path.write_bytes(b"first")
    with pytest.raises(FileExistsError):
        with open_private(path, "wb", replace=False) as handle:
            handle.write(b"second")
    assert path.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == [path.name]
