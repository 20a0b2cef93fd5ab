"""Model parts, lookup tables and scores are the party's alone: written 0600 whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

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
