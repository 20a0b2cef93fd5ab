"""Every writer of a party's private files refuses to write through a symbolic link planted in
its folder (issue 28, item 4): another local user who can write there must not get the worker
to overwrite a file the party owns elsewhere. Each writer runs for real with links planted at
the names it used to write through (``name.tmp``, ``stem.tmp``) and at the file itself."""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from boosting.tree import write_json_atomic
from fedboost.api_keys import write_keys
from messages.signing import write_key_pair
from workers import checkpoint
from workers.answered import AnsweredRecord
from workers.column_partitioned.scoring import write_scores_csv
from workers.horizontal import released

VICTIM = "the party's other file\n"


def _model_part(folder: Path) -> Path:
    write_json_atomic(folder / "lookup.json", {"nodes": [1]})
    return folder / "lookup.json"


def _scores(folder: Path) -> Path:
    write_scores_csv(folder / "scores.csv", ["a"], np.array([[0.5]]), "binary")
    return folder / "scores.csv"


def _checkpoint(folder: Path) -> Path:
    return checkpoint.save(folder.parent, 1, "spec", "run-a", {"trees": 1}, b"k" * 32)


def _released_roots(folder: Path) -> Path:
    released.save(folder, {"job": ["member"]})
    return folder / released.FILE


def _api_keys(folder: Path) -> Path:
    write_keys(folder / "keys.json", [])
    return folder / "keys.json"


def _answered_record(folder: Path) -> Path:
    record = AnsweredRecord(folder, keep_seconds=60)  # rewrites the file it finds
    record.add("job", "task")
    return record.path


WRITERS: dict[str, tuple[str, Callable[[Path], Path]]] = {
    # name: (the folder the file is written in, below tmp_path; the writer)
    "model part": ("model", _model_part),
    "scores": ("model", _scores),
    "checkpoint": (checkpoint.FOLDER, _checkpoint),
    "released roots": ("private", _released_roots),
    "API keys": ("serving", _api_keys),
    "answered record": ("private", _answered_record),
}
FILES = {"model part": "lookup.json", "scores": "scores.csv", "checkpoint": "trees-000001.ckpt",
         "released roots": released.FILE, "API keys": "keys.json",
         "answered record": "answered.jsonl"}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_links_planted_at_the_old_temporary_names_are_not_followed(tmp_path: Path,
                                                                   writer: str) -> None:
    folder_name, write = WRITERS[writer]
    folder = tmp_path / folder_name
    folder.mkdir()
    name = FILES[writer]
    victims = []
    for k, planted in enumerate({f"{name}.tmp", f"{Path(name).stem}.tmp"}):
        victim = tmp_path / f"victim-{k}"
        victim.write_text(VICTIM)
        (folder / planted).symlink_to(victim)
        victims.append(victim)
    written = write(folder)
    assert written == folder / name
    assert all(v.read_text() == VICTIM for v in victims), "a victim was written through a link"
    assert not written.is_symlink() and written.stat().st_size > 0
    assert stat.S_IMODE(written.stat().st_mode) == 0o600


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_link_planted_at_the_file_itself_is_replaced_not_written_through(
        tmp_path: Path, writer: str) -> None:
    folder_name, write = WRITERS[writer]
    folder = tmp_path / folder_name
    folder.mkdir()
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    (folder / FILES[writer]).symlink_to(victim)
    written = write(folder)
    assert victim.read_text() == VICTIM
    assert not written.is_symlink() and written.stat().st_size > 0


def test_the_answered_record_refuses_to_append_through_a_link(tmp_path: Path) -> None:
    record = AnsweredRecord(tmp_path, keep_seconds=60)
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    record.path.unlink()
    record.path.symlink_to(victim)  # planted while the worker runs
    with pytest.raises(OSError) as refused:
        record.add("job", "task")
    assert refused.value.errno == errno.ELOOP
    assert victim.read_text() == VICTIM


def test_the_checkpoint_key_is_never_made_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"  # missing: a key made through the link would appear there
    (tmp_path / checkpoint.KEY_FILE).symlink_to(victim)
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint key"):
        checkpoint.party_key(tmp_path)
    assert not victim.exists()


def test_signing_keys_are_never_written_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    (tmp_path / "guest.pub").symlink_to(victim)
    with pytest.raises(OSError) as refused:
        write_key_pair(tmp_path, "guest")
    assert refused.value.errno == errno.ELOOP
    assert victim.read_text() == VICTIM
