"""Per-job checkpoints of a party: its whole job state after each completed tree.

A checkpoint is written atomically (temporary file, fsync, rename) into the job's model folder
after binning (0 trees) and after every finished tree, so a restarted worker or a re-run flow
continues after the last tree every party completed. The two newest are kept: parties finish
a tree one after the other, so after a crash they may stand one tree apart, and all of them
must be able to go back to the last tree they share.

The file holds the private key (active party) and the party's own data: it is written 0600
inside the party's model folder, which only the party's worker reads. Its digest names the job
spec and the party's data file, so a changed job or changed data never resumes from it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack

from messages.bodies import Checkpoint, JobSpec, Resumed, TreeFinished
from messages.codec import to_wire
from workers import ProtocolError
from workers.state import JobState

FOLDER = "checkpoints"
MAGIC = b"fedboost-checkpoint-3\n"
"""The number changes with the layout of the pickled state (2: a passive party keeps its tree's
parsed ciphertexts; 3: the key holder's obfuscator, the level's open nodes, passive parties'
feature counts), so an older worker's checkpoint is never unpickled into the wrong fields."""
KEEP = 2
_NAME = re.compile(r"trees-(\d{6})\.ckpt")


class CheckpointError(ProtocolError):
    """A checkpoint is missing, damaged, or belongs to another job or data."""


def job_digest(spec: JobSpec, data_file: str, columns: list[str] | None) -> str:
    """What a checkpoint must match to be resumed: the job spec and this party's input."""
    h = hashlib.sha256(msgpack.packb(to_wire(spec), use_bin_type=True))
    with open(data_file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    h.update(repr(columns).encode())
    return h.hexdigest()


def _path(directory: Path, trees_done: int) -> Path:
    return directory / FOLDER / f"trees-{trees_done:06d}.ckpt"


def run_of(n: int) -> str:
    """A training run's id: a digest of its Paillier modulus (every party knows it)."""
    return hashlib.sha256(n.to_bytes((n.bit_length() + 7) // 8, "big")).hexdigest()[:16]


def save(directory: Path, trees_done: int, digest: str, run: str, state: Any) -> Path:
    """Write the state after ``trees_done`` trees; keep the newest ``KEEP`` checkpoints."""
    folder = directory / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for partial in _partial_files(directory):  # left by a worker killed while saving
        partial.unlink(missing_ok=True)
    payload = pickle.dumps({"digest": digest, "trees_done": trees_done, "run": run,
                            "state": state}, protocol=pickle.HIGHEST_PROTOCOL)
    target = _path(directory, trees_done)
    tmp = target.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    for old in sorted(available_files(directory))[:-KEEP]:
        old.unlink(missing_ok=True)
    return target


def _partial_files(directory: Path) -> list[Path]:
    folder = directory / FOLDER
    return sorted(folder.glob("*.tmp")) if folder.is_dir() else []


def available_files(directory: Path) -> list[Path]:
    folder = directory / FOLDER
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.fullmatch(p.name))


def available(directory: Path, digest: str) -> list[Checkpoint]:
    """The intact checkpoints of exactly this job and data."""
    found = []
    for path in available_files(directory):
        try:
            record = _read(path)
        except CheckpointError:
            continue  # a damaged file is not offered; an older one may still be
        if record["digest"] == digest:
            found.append(Checkpoint(int(record["trees_done"]), str(record["run"])))
    return sorted(found, key=lambda c: c.trees_done)


def load(directory: Path, wanted: Checkpoint, digest: str) -> Any:
    """The state saved after ``wanted.trees_done`` trees of run ``wanted.run`` of this job."""
    path = _path(directory, wanted.trees_done)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint after {wanted.trees_done} trees in {path.parent}")
    record = _read(path)
    if record["digest"] != digest or record["run"] != wanted.run:
        raise CheckpointError(f"{path} belongs to another job spec, data file or run")
    return record["state"]


def discard(directory: Path) -> None:
    """Remove the job's checkpoints (a finished job, or a fresh start), and any half-written
    one a killed worker left (it may hold the private key)."""
    for path in available_files(directory) + _partial_files(directory):
        path.unlink(missing_ok=True)
    if (directory / FOLDER).is_dir() and not any((directory / FOLDER).iterdir()):
        (directory / FOLDER).rmdir()


def _read(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    head, digest, payload = raw[:len(MAGIC)], raw[len(MAGIC):len(MAGIC) + 32], raw[len(MAGIC) + 32:]
    if head != MAGIC and head.startswith(MAGIC[:-2]):
        raise CheckpointError(f"{path} was written by another fedboost version "
                              f"({head.strip().decode(errors='replace')}); it cannot be resumed")
    if head != MAGIC or hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{path} is damaged (truncated or not a checkpoint)")
    # our own file, verified intact, in a folder only this party's worker writes
    record: dict[str, Any] = pickle.loads(payload)
    return record


def save_job(directory: Path, trees_done: int, state: JobState, modulus: int,
             **role_fields: Any) -> Path:
    """Checkpoint a training job of the run whose Paillier modulus is ``modulus``: the job
    state with the role's ``role_fields`` replaced (processes, the tree in progress) and no PSI
    secret (alignment is done)."""
    kept = replace(state, psi=None, role_state=replace(state.role_state, **role_fields))
    return save(directory, trees_done, state.digest, run_of(int(modulus)), kept)


def restore(directory: Path, wanted: Checkpoint, opened: JobState) -> JobState:
    """The state of ``wanted``, which must match the job just opened (spec and data)."""
    state: JobState = load(directory, wanted, opened.digest)
    return state


def resumed(state: JobState, trees_done: int, outputs: int = 0,
            history: list[TreeFinished] | None = None) -> Resumed:
    """The reply to resume_job: the restored alignment, and what only the active party knows."""
    aligned, valid = state.require_aligned()
    return Resumed(trees_done=trees_done, n_aligned=int(aligned.size),
                   n_train=int((~valid).sum()), n_valid=int(valid.sum()), outputs=outputs,
                   history=list(history or []))
