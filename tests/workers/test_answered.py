"""The persisted record of answered commands: survives a reload, forgets by age and bound, reads
what another process of the party appended, and shrugs off a torn last line."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

from workers.answered import COMPACT_SLACK, FILE, AnsweredRecord


def test_entries_persist_across_a_reload_with_private_modes(tmp_path: Path) -> None:
    record = AnsweredRecord(tmp_path, keep_seconds=3600)
    record.add("job", "s1/open_job/t-1/d-1")
    record.add("job", "s1/close_job/t-1/d-1")
    assert ("job", "s1/open_job/t-1/d-1") in record
    assert ("job", "s2/open_job/t-1/d-1") not in record and ("other", "s1/open_job/t-1/d-1") \
        not in record
    again = AnsweredRecord(tmp_path, keep_seconds=3600)  # a restarted worker
    assert ("job", "s1/open_job/t-1/d-1") in again and ("job", "s1/close_job/t-1/d-1") in again
    assert stat.S_IMODE((tmp_path / FILE).stat().st_mode) == 0o600


def test_entries_older_than_the_accepted_age_are_pruned(tmp_path: Path) -> None:
    old = time.time() - 7200
    (tmp_path / FILE).write_text(
        json.dumps({"at": old, "job": "job", "task": "s0/open"}) + "\n"
        + json.dumps({"at": time.time(), "job": "job", "task": "s1/open"}) + "\n")
    record = AnsweredRecord(tmp_path, keep_seconds=3600)
    assert ("job", "s0/open") not in record and ("job", "s1/open") in record
    assert len(record) == 1
    assert "s0/open" not in (tmp_path / FILE).read_text()  # rewritten at start
    longer = AnsweredRecord(tmp_path, keep_seconds=3 * 3600)
    assert ("job", "s1/open") in longer


def test_the_record_is_bounded_and_its_file_compacted(tmp_path: Path) -> None:
    record = AnsweredRecord(tmp_path, keep_seconds=3600, max_entries=10)
    for k in range(3 * COMPACT_SLACK):
        record.add("job", f"s{k}/open")
    assert len(record) == 10
    assert ("job", f"s{3 * COMPACT_SLACK - 1}/open") in record and ("job", "s0/open") not in record
    lines = (tmp_path / FILE).read_text().splitlines()
    assert len(lines) <= 2 * 10 + COMPACT_SLACK + 1


def test_another_process_sees_what_was_appended_and_survives_a_rewrite(tmp_path: Path) -> None:
    coordinator = AnsweredRecord(tmp_path, keep_seconds=3600)
    standby = AnsweredRecord(tmp_path, keep_seconds=3600)  # started at the same time
    coordinator.add("job", "s1/open")
    assert ("job", "s1/open") in standby  # it takes over the inbox: it knows
    AnsweredRecord(tmp_path, keep_seconds=3600)  # a third process starts: rewrites the file
    coordinator.add("job", "s1/close")
    assert ("job", "s1/close") in standby and ("job", "s1/open") in standby


def test_a_torn_last_line_is_skipped_and_ended(tmp_path: Path) -> None:
    record = AnsweredRecord(tmp_path, keep_seconds=3600)
    record.add("job", "s1/open")
    with (tmp_path / FILE).open("a") as f:
        f.write('{"at": 1e12, "job": "job", "ta')  # a writer killed mid-line
    record.add("job", "s1/close")
    again = AnsweredRecord(tmp_path, keep_seconds=3600)
    assert ("job", "s1/open") in again and ("job", "s1/close") in again
