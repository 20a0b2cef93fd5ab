"""A party's own configuration, as its worker file gives it: its data sets, model folder,
private folder and policy. Never sent over the wire."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers import DataError, ProtocolError
from workers.policy import PartyPolicy


@dataclass(frozen=True, slots=True)
class DataSet:
    """One of a party's data files, as its worker file names it: never sent over the wire."""

    path: str
    id_column: str = "id"
    label: str | None = None
    columns: list[str] | None = None
    """Feature columns to use (default: every column but the id and the label)."""
    categorical: list[str] | None = None
    """Feature columns of text this party encodes itself (``workers.data``)."""


@dataclass(frozen=True, slots=True)
class PartySpec:
    """A worker's local configuration: never sent over the wire.

    ``data``, ``id_column``, ``label`` and ``columns`` are the party's default data set (what a
    job uses when it names none); ``datasets`` are the others, by name. ``role`` is the only
    role the party takes in jobs ("" for any: each job says the party's role).
    """

    name: str
    role: str
    data: str
    id_column: str
    label: str | None
    model_dir: str
    columns: list[str] | None = None
    """Feature columns to use (default: every column but the id and the label)."""
    categorical: list[str] | None = None
    """Feature columns of text this party encodes itself (``workers.data``)."""
    processes: int = 1
    """Worker processes of this party: one coordinates, the others take shards of its work
    (a passive party's histograms, the active party's encryption and decryption)."""
    crypto_processes: int = 0
    """Local processes (cores) each of this party's processes encrypts and decrypts on
    (0: one per core)."""
    make_ahead: bool = True
    """Make Paillier obfuscators ahead on idle CPU (``crypto.pool``), as the active party."""
    policy: PartyPolicy = PartyPolicy()
    """The party's own policy (minimum key size, protocols): no job overrides it."""
    state_dir: str = ""
    """A folder only this party's worker reads (0700): the key that authenticates its
    checkpoints and its record of messages already answered. Default: ``.fedboost/<party>``
    beside the job folders of ``model_dir``."""

    datasets: dict[str, DataSet] = field(default_factory=dict)
    """Named data sets a job may ask for (``dataset: NAME`` in the job file)."""

    def dataset(self, name: str = "") -> DataSet:
        """The data set a job names ("" or "default": the default one); a name this party does
        not have is a ``DataError`` naming the party and the data set."""
        if name in self.datasets:
            return self.datasets[name]
        if name in ("", "default") and self.data:
            return DataSet(self.data, self.id_column, self.label, self.columns, self.categorical)
        known = sorted(self.datasets) + (["default"] if self.data else [])
        raise DataError(f"party {self.name} has no data set {name or 'default'!r} in its worker "
                        f"file (it has: {', '.join(known) or 'none'})")

    def dataset_in(self, parties: list[Any]) -> DataSet:
        """The data set a job's list of parties (``PartyInfo``) names for this party."""
        return self.dataset(next((p.dataset for p in parties if p.name == self.name), ""))

    def model_folder(self, job: str) -> Path:
        """Where job ``job``'s model part lives (``{job}`` in ``model_dir`` is the job id);
        always inside the folder before ``{job}``, whatever the job is named."""
        path = Path(self.model_dir.replace("{job}", job))
        if "{job}" in self.model_dir:
            root = Path(self.model_dir.split("{job}", 1)[0]).resolve()
            if root not in path.resolve().parents:
                raise ProtocolError(f"{self.name}: job {job!r} would put its model folder "
                                    f"outside {root}: refused")
        return path

    def private_dir(self) -> Path:
        """The party's private folder, created 0700 if missing."""
        if self.state_dir:
            path = Path(self.state_dir)
        elif "{job}" in self.model_dir:
            path = Path(self.model_dir.split("{job}", 1)[0]) / ".fedboost" / self.name
        else:
            path = Path(self.model_dir) / ".fedboost"
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.chmod(0o700)
        return path
