"""Per-job checkpoints of a party: its whole job state after each completed tree.

A checkpoint is written atomically (temporary file, fsync, rename) into the job's model folder
after binning (0 trees) and after every finished tree, so a restarted worker or a re-run flow
continues after the last tree every party completed. The two newest are kept: parties finish
a tree one after the other, so after a crash they may stand one tree apart, and all of them
must be able to go back to the last tree they share.

The file holds the private key (active party) and what the party derived from its own data
(cuts, bins, the validation rows' features), not the data set itself: it is written 0600
inside the party's model folder, which only the party's worker reads. Its digest names the job
spec and the party's data file, so a changed job or changed data never resumes from it, and a
resumed job loads the very rows the checkpoint was made from again.

Reading one must never run code, whoever wrote the file: the state is msgpack through a typed
codec (``workers._state_codec``) that rebuilds only the dataclasses listed in ``_state_types``
(the shared ones here, and those a protocol's modules register with ``register_state_types``),
and the file carries an HMAC-SHA256 under a key of this party (``checkpoint.key`` in its
private folder, made on first use, never sent) that is checked before the state is parsed. A
file without this party's tag, or an older pickled checkpoint, is refused by name.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
from dataclasses import replace
from functools import cache
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgpack
import numpy as np

from boosting.params import BoostParams
from boosting.tree import Tree, TreeNode, open_private
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.ou import OUPrivateKey, OUPublicKey
from crypto.paillier import PaillierPrivateKey, PaillierPublicKey
from messages.bodies import Checkpoint, Metric, Resumed, TreeFinished
from messages.codec import to_wire
from workers import ProtocolError
from workers._state_codec import StateCodecError, pack, type_names, unpack
from workers.data import PartyData
from workers.state import JobState

if TYPE_CHECKING:
    from workers.party import PartySpec

log = logging.getLogger("fedboost.worker")

FOLDER = "checkpoints"
MAGIC = b"fedboost-checkpoint-4\n"
"""The number changes with the file's layout or what it was made under (4: wire version 5,
a job's tree parameters nested in its spec, ``messages.params``; 3: the same msgpack state
with an HMAC, under wire version 4; 1 and 2 were pickles). Older formats are refused, never
read."""
_MAGIC_PREFIX = b"fedboost-checkpoint-"
TAG_BYTES = 32
KEY_FILE = "checkpoint.key"
KEY_BYTES = 32
KEEP = 2
_NAME = re.compile(r"trees-([0-9]{6})\.ckpt")


class CheckpointError(ProtocolError):
    """A checkpoint is missing, damaged, not this party's, or of another job or data."""


_REGISTERED: list[type] = []


def register_state_types(*classes: type) -> None:
    """Let checkpoints rebuild a protocol's own state classes: the module defining them
    registers them as it is imported (a checkpoint's state comes from that module's steps;
    nothing else is ever rebuilt)."""
    _REGISTERED.extend(c for c in classes if c not in _REGISTERED)
    _state_types.cache_clear()


@cache
def _state_types() -> dict[str, type]:
    """Every class a checkpoint may rebuild: the shared ones, and the protocols' own."""
    return type_names(JobState, PartyData, BoostParams, PaillierPublicKey, PaillierPrivateKey,
                      OUPublicKey, OUPrivateKey, GradientPacker, BinSumPacking, Tree, TreeNode,
                      TreeFinished, Metric, *_REGISTERED)


def party_key(private_dir: Path) -> bytes:
    """This party's checkpoint key: ``checkpoint.key`` (0600) in its private folder, 32 random
    bytes made on first use. It never leaves the folder (not sent, not logged)."""
    path = private_dir / KEY_FILE
    if not path.exists():
        try:  # never replaces a key another process of the party just made
            with open_private(path, "wb", replace=False) as f:
                f.write(secrets.token_bytes(KEY_BYTES))
        except FileExistsError:
            if not os.path.lexists(path):  # not that: a name taken beside it
                raise
    try:
        key = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"checkpoint key {path}: {exc.strerror}") from None
    if len(key) != KEY_BYTES:
        raise CheckpointError(f"checkpoint key {path} is damaged ({len(key)} bytes, not "
                              f"{KEY_BYTES})")
    return key


def key_of(party: PartySpec) -> bytes:
    """The checkpoint key of a worker's party."""
    return party_key(party.private_dir())


def job_digest(spec: Any, data_file: str, columns: list[str] | None,
               categorical: list[str] | None = None) -> str:
    """What a checkpoint must match to be resumed: the job spec and this party's input."""
    h = hashlib.sha256(msgpack.packb(to_wire(spec), use_bin_type=True))
    with open(data_file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    h.update(repr(columns).encode())
    if categorical:  # other codes, other model (none: the digest of files before categories)
        h.update(repr(sorted(categorical)).encode())
    return h.hexdigest()


def _path(directory: Path, trees_done: int) -> Path:
    return directory / FOLDER / f"trees-{trees_done:06d}.ckpt"


def run_of(n: int) -> str:
    """A training run's id: a digest of its Paillier modulus (every party knows it)."""
    return hashlib.sha256(n.to_bytes((n.bit_length() + 7) // 8, "big")).hexdigest()[:16]


def _tag(key: bytes, payload: bytes | memoryview) -> bytes:
    """The HMAC-SHA256 of the file's magic and state under the party's key."""
    mac = hmac.new(key, MAGIC, hashlib.sha256)
    mac.update(payload)
    return mac.digest()


def save(directory: Path, trees_done: int, digest: str, run: str, state: Any,
         key: bytes) -> Path:
    """Write the state after ``trees_done`` trees; keep the newest ``KEEP`` checkpoints."""
    folder = directory / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for partial in _partial_files(directory):  # left by a worker killed while saving
        partial.unlink(missing_ok=True)
    try:
        payload = pack({"digest": digest, "trees_done": trees_done, "run": run, "state": state},
                       _state_types())
    except StateCodecError as exc:
        raise CheckpointError(f"checkpoint after {trees_done} trees in {folder}: {exc}") from None
    target = _path(directory, trees_done)
    with open_private(target, "wb") as f:
        f.write(MAGIC + _tag(key, payload))
        f.write(payload)  # not joined to the header: the payload holds the party's data
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


def newest_on_disk(directory: Path) -> int | None:
    """The trees done of the newest checkpoint file in ``directory`` by its name (None: no
    checkpoint); not read, so not checked: for a hint, never for resuming."""
    names = [_NAME.fullmatch(p.name) for p in available_files(directory)]
    return max((int(m.group(1)) for m in names if m), default=None)


def available(directory: Path, digest: str, key: bytes) -> list[Checkpoint]:
    """The intact checkpoints of exactly this job and data, written by this party."""
    found = []
    for path in available_files(directory):
        try:
            record = _read(path, key)
        except CheckpointError as exc:  # not offered; an older one may still be
            log.warning("checkpoint not offered: %s", exc)
            continue
        if record["digest"] == digest:
            found.append(Checkpoint(record["trees_done"], record["run"]))
    return sorted(found, key=lambda c: c.trees_done)


def load(directory: Path, wanted: Checkpoint, digest: str, key: bytes) -> Any:
    """The state saved after ``wanted.trees_done`` trees of run ``wanted.run`` of this job."""
    path = _path(directory, wanted.trees_done)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint after {wanted.trees_done} trees in {path.parent}")
    record = _read(path, key)
    if (record["digest"] != digest or record["run"] != wanted.run
            or record["trees_done"] != wanted.trees_done):
        raise CheckpointError(f"{path} belongs to another job spec, data file or run")
    return record["state"]


class Record(Protocol):
    """A protocol's checkpoint state: a dataclass it registers (``register_state_types``)
    holding the trees done."""

    @property
    def trees(self) -> Sequence[Any]: ...


R = TypeVar("R", bound=Record)


def load_record(directory: Path, wanted: Checkpoint, digest: str, key: bytes, kind: type[R],
                who: str, older: Callable[[str, dict[str, Any]], R] | None = None) -> R:
    """The ``kind`` saved after ``wanted.trees_done`` trees of this job, checked: one typed
    idiom for every protocol whose state is a record. A state of the dict layout from before
    the records goes through ``older`` (which refuses formats it cannot read by name); any
    other state, or trees that do not match, is damaged. ``older`` gets the checkpoint's name
    for its refusals (``who: the checkpoint after N trees in DIR``)."""
    where = f"{who}: the checkpoint after {wanted.trees_done} trees in {directory}"
    state = load(directory, wanted, digest, key)
    if isinstance(state, dict) and older is not None:
        state = older(where, state)
    if not isinstance(state, kind) or len(state.trees) != wanted.trees_done:
        raise CheckpointError(f"{where} is damaged")
    return state


def older_state(where: str, saved: dict[str, Any], keys: set[str], formats: dict[int, str],
                current: int) -> dict[str, Any]:
    """A checkpoint state of the dict layout (``{"format": n, ...}``, before typed records),
    with ``keys``; a format other than ``current`` is refused with ``formats[n]``'s reason
    (``where`` names the checkpoint: ``load_record``)."""
    version = saved.get("format", 1)
    if version != current:
        raise CheckpointError(f"{where} is of "
                              f"{formats.get(version, f'format {version}, unknown here')}: "
                              f"refused; remove its checkpoints folder to train the job afresh")
    if not keys <= set(saved) or not isinstance(saved["trees"], list):
        raise CheckpointError(f"{where} (format {version}) is damaged")
    return saved


def discard(directory: Path) -> None:
    """Remove the job's checkpoints (a finished job, or a fresh start), and any half-written
    one a killed worker left (it may hold the private key)."""
    for path in available_files(directory) + _partial_files(directory):
        path.unlink(missing_ok=True)
    if (directory / FOLDER).is_dir() and not any((directory / FOLDER).iterdir()):
        (directory / FOLDER).rmdir()


def _read(path: Path, key: bytes) -> dict[str, Any]:
    """The record of a checkpoint file, authenticated before anything in it is parsed."""
    raw = path.read_bytes()
    head = raw[:len(MAGIC)]
    if head != MAGIC:
        if head.startswith(_MAGIC_PREFIX):
            version = raw[len(_MAGIC_PREFIX):raw.find(b"\n", 0, 64)].decode(errors="replace")
            if version in ("1", "2"):
                raise CheckpointError(f"{path} is a checkpoint of format {version!r} (format 1 "
                                      f"and 2 were pickles): refused, never read; remove it")
            raise CheckpointError(f"{path} is a checkpoint of format {version!r}, written by an "
                                  f"older fedboost (before wire version 5): refused; remove it "
                                  f"(the job trains again from its first tree)")
        raise CheckpointError(f"{path} is not a checkpoint (truncated or another file): refused")
    tag, payload = raw[len(MAGIC):len(MAGIC) + TAG_BYTES], memoryview(raw)[len(MAGIC) + TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(key, payload)):
        raise CheckpointError(f"{path} does not carry this party's authentication tag (damaged, "
                              f"altered, or written under another party's key): refused")
    try:
        record = unpack(payload, _state_types())
    except StateCodecError as exc:  # our own key, but not our layout: a bug, not an attack
        raise CheckpointError(f"{path}: {exc}") from None
    if not (isinstance(record, dict) and isinstance(record.get("digest"), str)
            and type(record.get("trees_done")) is int and isinstance(record.get("run"), str)
            and "state" in record):
        raise CheckpointError(f"{path} is not a checkpoint record: refused")
    return record


def save_job(directory: Path, trees_done: int, state: JobState, modulus: int, *, key: bytes,
             **role_fields: Any) -> Path:
    """Checkpoint a training job of the run whose Paillier modulus is ``modulus``: the job
    state with the role's ``role_fields`` replaced (processes, the tree in progress) and no PSI
    secret (alignment is done)."""
    kept = replace(state, psi=None, data=_NO_DATA,
                   role_state=replace(state.role_state, **role_fields))
    return save(directory, trees_done, state.digest, run_of(int(modulus)), kept, key)


_NO_DATA = PartyData(ids=[], names=(), x=np.empty((0, 0)), y=None)
"""What a checkpoint keeps of the party's data set: nothing. Its digest names the data file,
so a resumed job loads the very same rows again (``restore``); writing them too made every
checkpoint at a million rows x 50 features 450 MB, and 1.3 GB of transient copies."""


def restore(directory: Path, wanted: Checkpoint, opened: JobState, key: bytes) -> JobState:
    """The state of ``wanted``, which must match the job just opened (spec and data)."""
    state = load(directory, wanted, opened.digest, key)
    if not isinstance(state, JobState) or state.party != opened.party:
        raise CheckpointError(f"checkpoint after {wanted.trees_done} trees in {directory} is not "
                              f"{opened.party}'s job state")
    return replace(state, data=opened.data)  # the same file: the digest says so


def resumed(state: JobState, trees_done: int, outputs: int = 0,
            history: list[TreeFinished] | None = None) -> Resumed:
    """The reply to resume_job: the restored alignment, and what only the active party knows."""
    aligned, valid = state.require_aligned()
    return Resumed(trees_done=trees_done, n_aligned=int(aligned.size),
                   n_train=int((~valid).sum()), n_valid=int(valid.sum()), outputs=outputs,
                   history=list(history or []))
