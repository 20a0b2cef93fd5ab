"""A party's own worker file (``fedboost worker --config``): its data sets, models, policy and
broker, or its entry in a job file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from flows.broker_settings import SigningConfig, TransportConfig, resolve_transport
from flows.config import parse_config
from flows.job_schema import PolicyConfig
from flows.schema_base import NAME_PATTERN, ConfigError, Strict, describe, read_yaml, resolve_path


class DataSetConfig(Strict):
    """One of a party's data files, named in its worker file's ``datasets:``."""

    data: Path
    id: str = "id"
    label: str | None = None
    columns: list[str] | None = None
    categorical: list[str] | None = None
    """Feature columns of text this party encodes itself (vertical jobs)."""


class WorkerConfig(Strict):
    """A party's own worker file: its data sets, where its models go, and the broker. One
    worker serves jobs of every protocol its policy lists, each job naming the party's role
    and data set."""

    party: str
    role: Literal["active", "passive", "member", "aggregator"] | None = None
    """The only role this party takes (default: whatever each job gives it)."""
    data: Path | None = None
    """The default data set's file (what a job uses when it names no data set)."""
    id: str = "id"
    label: str | None = None
    columns: list[str] | None = None
    categorical: list[str] | None = None
    """The default data set's feature columns of text, which this party encodes itself."""
    datasets: dict[str, DataSetConfig] = {}
    """Further data sets by name; a job file picks one with ``dataset: NAME``."""
    models: Path = Path("models")
    """This party's model part of job J goes to ``models/J/<party>/``."""
    policy: PolicyConfig = PolicyConfig()
    """What this party accepts, whatever a job asks (minimum key size, protocols)."""
    state: Path | None = None
    """The party's private folder (checkpoint key, answered messages); default
    ``models/.fedboost/<party>``."""
    processes: int = Field(1, ge=1, le=64)
    """Processes this command starts (one coordinates, the others take shards of its work)."""
    crypto_processes: int | None = Field(None, ge=1, le=256)
    """Local processes (cores) each process of an active party encrypts and decrypts on
    (default: one per core of its machine)."""
    make_ahead: bool = True
    """An active party makes Paillier obfuscators ahead on CPU time nothing else wants (idle
    priority, at most 256 MB of them; ``crypto.pool``); false: only as encryption needs them."""
    max_message_age: float = Field(2 * 3600.0, ge=60.0, le=7 * 24 * 3600.0)
    """Seconds after it was signed that a message is still accepted (default: twice the flows'
    default ``transport.step_timeout``); keep it above the step_timeout of the jobs served.
    The party's record of answered commands keeps each at least this long."""
    transport: TransportConfig = TransportConfig(kind="rabbitmq")
    signing: SigningConfig
    """This party's signing key (``<party>.key``) and the federation's public keys."""

    @model_validator(mode="after")
    def _consistent(self) -> WorkerConfig:
        if self.transport.kind != "rabbitmq":
            raise ValueError("transport.kind: a long-running worker needs rabbitmq")
        if self.role in ("active", "passive") and self.data is not None and \
                (self.role == "active") != (self.label is not None):
            raise ValueError("label: the active party needs one, a passive party must not have one")
        for name in self.datasets:
            if not re.fullmatch(NAME_PATTERN, name) or name == "default":
                raise ValueError(f"datasets: name {name!r} must be 1-32 letters, digits, '_', "
                                 f"'-' (and not 'default', the name of data:)")
        if self.data is None and not self.datasets and self.role != "aggregator":
            raise ValueError("data: a worker needs a data file (data:) or named data sets "
                             "(datasets:), unless its role is aggregator")
        return self

    def data_files(self) -> dict[str, Path]:
        """Every data set's file, by data set name (``default``: ``data:``)."""
        files = {"default": self.data} if self.data is not None else {}
        return {**files, **{name: d.data for name, d in self.datasets.items()}}


def load_worker_config(path: str | Path, party: str) -> WorkerConfig:
    """A worker's settings from its own worker file, or from its entry in a job file."""
    path = Path(path)
    raw = read_yaml(path)
    base = path.resolve().parent
    if isinstance(raw, dict) and "parties" in raw:
        job = parse_config(raw, base=base, source=str(path))
        if party not in job.parties:
            raise ConfigError(f"config file {path}: no party {party!r} (parties: "
                              f"{', '.join(job.parties)})")
        entry = job.parties[party]
        raw = {"party": party, "role": entry.role, "data": entry.data, "id": entry.id,
               "label": entry.label, "columns": entry.columns,
               "categorical": getattr(entry, "categorical", None),
               # the job file's own protocol: this party's entry in it is an opt-in
               "policy": entry.policy or PolicyConfig.model_validate({"protocols": [job.protocol]}),
               # like 'fedboost train''s runs/: beside where it starts (README, .gitignore),
               # not beside the job file (configs/models/ sat in the checkout, unignored)
               "models": Path.cwd() / "models", "transport": job.transport.model_dump(),
               "signing": job.signing.model_dump() if job.signing else None}
        if entry.data is None and entry.role != "aggregator":
            raise ConfigError(f"config file {path}: parties.{party}.data is required to start "
                              f"its worker")
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level")
    try:
        config = WorkerConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"config file {path}: {describe(exc)}") from None
    if config.party != party:
        raise ConfigError(f"config file {path} is for party {config.party!r}, not {party!r}")
    datasets = {name: d.model_copy(update={"data": resolve_path(base, d.data)})
                for name, d in config.datasets.items()}
    return config.model_copy(update={"data": resolve_path(base, config.data),
                                     "datasets": datasets,
                                     "models": resolve_path(base, config.models),
                                     "state": resolve_path(base, config.state),
                                     "transport": resolve_transport(base, config.transport),
                                     "signing": config.signing.model_copy(update={
                                         "key_dir": resolve_path(base, config.signing.key_dir)})})
