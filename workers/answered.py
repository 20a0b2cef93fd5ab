"""A party's record of the commands its worker already answered, kept on disk.

Nonces and answered task ids held in memory are forgotten when the worker restarts, and a
captured command stays validly signed for the accepted message age: without this record a
replayed OPEN_JOB + CLOSE_JOB reopened a finished job after a restart and deleted its
checkpoints. Every answered command is appended here, as one JSON line ``{"at", "job",
"task"}``, and fsynced before its reply goes out; a command whose (job, task) is on record is
refused, whenever it comes (and the flow is told its state is lost: the worker may have been
killed between recording the answer and sending it, ``Worker.handle_bytes``). A task id
carries its flow session, so this also covers every session ever opened.

The file lives in the party's private folder (``PartySpec.private_dir``), mode 0600. Entries
are kept at least ``keep_seconds`` (the accepted message age plus clock skew: older messages
are refused by their signed send time before anything) and at most ``MAX_ENTRIES``. Several
processes of one party may share the folder (one coordinates at a time, another may take over):
each appends under an exclusive lock (``answered.lock``) and reads what the others appended
before it answers, so a process that takes over the inbox knows what its predecessor answered.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from boosting.tree import open_private

log = logging.getLogger("fedboost.worker")

FILE = "answered.jsonl"
LOCK = "answered.lock"
MAX_ENTRIES = 200_000
"""Entries kept at most (~100 bytes each). A flow sends a few commands per tree level, so this
holds weeks of jobs; beyond it the oldest are forgotten, with a warning."""
COMPACT_SLACK = 1024
"""The file is rewritten when it holds this many lines more than twice the live entries."""

Key = tuple[str, str]


class AnsweredRecord:
    """(job, task) of every command answered within ``keep_seconds``, persisted."""

    def __init__(self, folder: Path, keep_seconds: float,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.path, self._lock_path = folder / FILE, folder / LOCK
        self.keep_seconds, self.max_entries = keep_seconds, max_entries
        self._entries: dict[Key, float] = {}
        """Answer times, oldest first (the file's order)."""
        self._inode, self._offset, self._lines = -1, 0, 0
        self._warned_full = False
        with self._locked():
            self._read()
            self._prune(time.time())
            self._compact()

    def __contains__(self, key: Key) -> bool:
        self._read()  # what another process of the party answered since
        at = self._entries.get(key)
        return at is not None and at >= time.time() - self.keep_seconds

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, job: str, task: str) -> None:
        """Record an answered command durably (append, fsync) before its reply is sent."""
        now = time.time()
        line = json.dumps({"at": round(now, 3), "job": job, "task": task},
                          separators=(",", ":")).encode() + b"\n"
        with self._locked():
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # a process killed mid-line: end that line first
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._read()
            self._prune(now)
            if self._lines > 2 * len(self._entries) + COMPACT_SLACK:
                self._compact()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _read(self) -> None:
        """Take in the complete lines appended since the last read (all of them if another
        process rewrote the file)."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            st = os.fstat(f.fileno())
            if st.st_ino != self._inode or st.st_size < self._offset:
                self._inode, self._offset, self._lines = st.st_ino, 0, 0
            if st.st_size == self._offset:
                return
            f.seek(self._offset)
            data = f.read(st.st_size - self._offset)
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        for line in data[:end].splitlines():
            self._lines += 1
            try:
                raw = json.loads(line)
                key, at = (str(raw["job"]), str(raw["task"])), float(raw["at"])
            except (ValueError, KeyError, TypeError):
                continue  # the torn end of a killed writer's line
            self._entries.pop(key, None)  # keep the order by answer time
            self._entries[key] = at
        self._offset += end

    def _prune(self, now: float) -> None:
        horizon = now - self.keep_seconds
        while self._entries:
            oldest = next(iter(self._entries))
            if self._entries[oldest] >= horizon and len(self._entries) <= self.max_entries:
                break
            if self._entries[oldest] >= horizon and not self._warned_full:
                log.warning("record of answered commands %s is full (%d entries): the oldest "
                            "are forgotten before %.0f s", self.path, self.max_entries,
                            self.keep_seconds)
                self._warned_full = True
            del self._entries[oldest]

    def _compact(self) -> None:
        """Rewrite the file with the live entries only (called under the lock)."""
        with open_private(self.path, "wb") as f:
            for (job, task), at in self._entries.items():
                f.write(json.dumps({"at": at, "job": job, "task": task},
                                   separators=(",", ":")).encode() + b"\n")
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash
        finally:
            os.close(dir_fd)
        st = os.stat(self.path)
        self._inode, self._offset, self._lines = st.st_ino, st.st_size, len(self._entries)
