"""Job files (YAML), validated with pydantic at the edge.

Unknown keys and bad values are errors that name the key; relative data paths resolve against
the config file's folder.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError,
                      ValidationInfo, create_model, field_validator, model_validator)

from messages.broker_url import holds_password, with_password, without_password
from messages.names import JOB_NAME_RULE, is_job_name
from messages.params import TreeParams
from messages.tls import TlsOptions


class ConfigError(ValueError):
    """A job file is missing, unreadable or invalid."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}"
"""Party and data set names: 1-32 letters, digits, '_', '-'."""


def _known_protocol(name: str) -> str:
    known = job_schemas()
    if name not in known:
        raise ValueError(f"{name!r} is not a protocol (known: {', '.join(known)})")
    return name


Protocol = Annotated[str, AfterValidator(_known_protocol)]
"""A protocol's name, as a job file's ``protocol:`` gives it (``job_schemas`` knows them all)."""


class PolicyConfig(_Strict):
    """A party's own policy (``workers.policy.PartyPolicy``): what its worker accepts."""

    min_key_bits: int = Field(2048, ge=1024, le=8192)
    """Smallest Paillier modulus the party generates or accepts."""
    schemes: list[Literal["paillier", "ou"]] = ["paillier", "ou"]
    """Encryption schemes the party generates or accepts (``crypto.scheme``; docs/crypto.md)."""
    min_ou_key_bits: int = Field(2048, ge=1024, le=8192)
    """Smallest Okamoto-Uchiyama modulus (n = p^2 q) the party generates or accepts."""
    protocols: list[Protocol] = ["vertical_secureboost"]
    """Protocols the party takes part in (a worker file lists each one it opts into)."""
    obfuscator: Literal["short", "full"] = "short"
    """Key holder's Paillier obfuscators: short exponent (fast) or full-length r^n."""
    predict_modes: list[Literal["path", "batched"]] = ["path"]
    """Prediction modes a passive party answers (batched reveals all its decisions)."""
    pack_bin_sums: list[Literal["key_holder", "passive"]] = ["key_holder", "passive"]
    """Who may fold a passive party's encrypted bin sums: ``[passive]`` refuses jobs that send
    one sum per ciphertext to the key holder (each shows a whole plaintext to it)."""
    roles: dict[Protocol, list[Literal["active", "passive", "member", "aggregator"]]] = {}
    """Per protocol, the only roles the party takes, e.g. ``{vertical_secureboost: [active],
    horizontal: [member]}`` (a protocol not named: any role a job gives it)."""


class PartyConfig(_Strict):
    """One party: its role and (in the embedded default) its data file."""

    role: Literal["active", "passive"]
    data: Path | None = None
    """The party's CSV file; needed where this file starts the party's worker (embedded
    default, ``fedboost worker``), not by a flow that reaches running workers over a broker."""
    dataset: str | None = Field(None, pattern=f"^{NAME_PATTERN}$")
    """Over a broker: the name of the data set in the party's own worker file (``datasets:``);
    the flow never sends a path. Default: the worker's default data set (its ``data:``)."""
    id: str = "id"
    label: str | None = None
    columns: list[str] | None = None
    """Feature columns this party contributes (default: all but id and label)."""
    categorical: list[str] | None = None
    """Feature columns of text this party encodes itself (codes of its sorted distinct values,
    kept with its model part); any other column must hold numbers."""
    policy: PolicyConfig | None = None
    """The party's policy where this file starts its worker (``fedboost worker --config
    job.yaml``: default ``PolicyConfig()``; the embedded default, where one operator runs every
    party on one machine: ``fedboost.embedded.embedded_policy()`` unless given)."""
    processes: int | None = Field(None, ge=1, le=64)
    """Worker processes the embedded default starts for this party (default: one per core for
    a passive party, whose histogram shards they share; one for the active party)."""


class _TreeParamsBase(_Strict):
    def tree_params(self) -> TreeParams:
        """The parameters as every opener carries them (``messages.params``)."""
        return TreeParams(**self.model_dump(include=set(TREE_PARAMS)))


def _tree_param(f: dataclasses.Field[Any]) -> tuple[Any, Any]:
    kind = (Literal[f.metadata["choices"]] if "choices" in f.metadata  # type: ignore[valid-type]
            else typing.get_type_hints(TreeParams)[f.name])
    return kind, Field(f.default, **f.metadata.get("bounds", {}))


TREE_PARAMS = {f.name: f for f in dataclasses.fields(TreeParams)}
_TreeParams: type[_TreeParamsBase] = create_model(  # type: ignore[call-overload]
    "_TreeParams", __base__=_TreeParamsBase,
    __doc__="Boosting parameters every protocol shares (``messages.params.TreeParams``).",
    **{name: _tree_param(f) for name, f in TREE_PARAMS.items()})


class ParamsConfig(_TreeParams):
    """Vertical SecureBoost's boosting parameters."""

    complete_secure: bool = False
    """Completely SecureBoost: the first round's trees grow on the active party alone."""
    early_stopping_rounds: int | None = Field(None, ge=1)
    """Stop once the first validation metric has not improved for this many rounds (as
    XGBoost's); the model keeps the rounds up to the best one (``flows.early_stopping``).
    Needs ``validation.fraction``."""


class _NoEarlyStopping:
    """Protocols without a validation set refuse ``early_stopping_rounds`` with the reason."""

    why_no_early_stopping: ClassVar[str] = "its label holders hold out no validation rows"

    @model_validator(mode="before")
    @classmethod
    def _no_early_stopping(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "early_stopping_rounds" in raw:
            raise ValueError(f"early_stopping_rounds: not available in this protocol: "
                             f"{cls.why_no_early_stopping}")
        return raw


class CryptoConfig(_Strict):
    """Homomorphic encryption settings."""

    scheme: Literal["paillier", "ou"] = "paillier"
    """``paillier``, or ``ou`` (Okamoto-Uchiyama: half the ciphertext bytes and cheaper
    arithmetic at the same modulus size, docs/crypto.md). Vertical protocols only."""
    key_bits: int = Field(2048, ge=1024, le=4096)
    pack_bin_sums: Literal["key_holder", "passive"] = "key_holder"
    """Who folds several encrypted bin sums into one ciphertext (``crypto.compress``): the key
    holder, modulo p^2 and q^2 (less CPU in all, 16x the histogram bytes), or each passive
    party before sending (for slow links between the parties). SecureBoost only."""

    @field_validator("key_bits")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError("key_bits must be even")
        return v


class ValidationConfig(_Strict):
    """Hold-out of aligned rows for validation metrics."""

    fraction: float = Field(0.0, ge=0.0, le=0.9)
    seed: int = Field(0, ge=0)


AMQP_URL_ENV = "FEDBOOST_AMQP_URL"
"""Overrides ``transport.url``: keeps broker passwords out of shared job files."""
AMQP_PASSWORD_FILE_ENV = "FEDBOOST_AMQP_PASSWORD_FILE"
"""Overrides ``transport.password_file``."""
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


class TlsConfig(_Strict):
    """TLS to the broker (``transport.tls``; needs an ``amqps://`` URL). The broker's
    certificate and name are always verified; there is no switch to turn that off."""

    ca_file: Path | None = None
    """CA certificate(s) the broker's certificate must chain to (default: the system's)."""
    cert_file: Path | None = None
    """This participant's client certificate (PEM), for a broker that requires one."""
    key_file: Path | None = None
    """The client certificate's private key (PEM)."""
    server_hostname: str | None = Field(None, min_length=1, max_length=253)
    """The name the broker's certificate must carry (default: the URL's host)."""

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file: give both (client certificate and its key) "
                             "or neither")
        return self

    def resolved(self, base: Path) -> TlsConfig:
        """Relative paths made absolute against ``base`` (the config file's folder)."""
        return self.model_copy(update={key: _resolve(base, getattr(self, key))
                                       for key in ("ca_file", "cert_file", "key_file")})

    def options(self) -> TlsOptions:
        """The settings as ``messages.rabbitmq.RabbitTransport`` takes them."""
        def text(path: Path | None) -> str | None:
            return None if path is None else str(path)
        return TlsOptions(ca_file=text(self.ca_file), cert_file=text(self.cert_file),
                          key_file=text(self.key_file), server_hostname=self.server_hostname)


class TransportConfig(_Strict):
    """How parties talk: ``memory`` is the embedded default (one machine, no services);
    ``rabbitmq`` reaches long-running party workers through a broker."""

    kind: Literal["memory", "rabbitmq"] = "memory"
    url: str | None = None
    """``amqp://user@host:port/vhost`` (default: the local broker as guest). A password written
    here is cut out before the job is saved or handed to Prefect, with a warning: give it
    through ``FEDBOOST_AMQP_URL`` or ``password_file``."""
    chunk_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024, le=128 * 1024 * 1024)
    """Messages above this size travel in chunks (RabbitMQ 4 refuses messages above 16 MiB)."""
    partial_seconds: float = Field(120.0, ge=1.0, le=24 * 3600.0)
    """A partly received chunked message without a new chunk for this long (while the receiver
    waits for mail) is dropped and its chunks acknowledged."""
    step_timeout: float = Field(3600.0, ge=1.0, le=7 * 24 * 3600.0)
    """Seconds the flow waits for a party to answer one step before it fails the job, naming
    the party and the step (a party that never comes back)."""
    tls: TlsConfig | None = None
    """TLS settings (CA, client certificate); an ``amqps://`` URL without them still uses TLS,
    verified against the system's CA store."""
    password_file: Path | None = None
    """A file holding the password of ``url``'s user (its first line; the environment's
    ``FEDBOOST_AMQP_PASSWORD_FILE`` overrides it): only the path reaches run folders and
    Prefect. Relative paths resolve against the config file's folder."""

    @field_validator("url")
    @classmethod
    def _amqp(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("amqp://", "amqps://")):
            raise ValueError("must be an amqp:// or amqps:// URL")
        return v

    @field_validator("tls")
    @classmethod
    def _tls_needs_amqps(cls, v: TlsConfig | None, info: ValidationInfo) -> TlsConfig | None:
        url = info.data.get("url")
        if v is not None and url is not None and not url.startswith("amqps://"):
            raise ValueError(f"needs an amqps:// url, not {url.split('://')[0]}:// (TLS is "
                             f"never added to a plain amqp:// URL)")
        return v

    def tls_options(self) -> TlsOptions | None:
        """The TLS settings for ``messages.rabbitmq.RabbitTransport`` (None: none given)."""
        return None if self.tls is None else self.tls.options()

    def amqp_url(self) -> str:
        """The broker URL: the environment's ``FEDBOOST_AMQP_URL``, else ``url``, else local;
        a URL naming a user but no password takes it from the password file."""
        url = os.environ.get(AMQP_URL_ENV) or self.url or DEFAULT_AMQP_URL
        parts = urlsplit(url)
        if parts.password is not None:
            return url
        path = os.environ.get(AMQP_PASSWORD_FILE_ENV) or self.password_file
        if parts.username is None:
            if path is not None:
                raise ConfigError(f"transport.password_file {path}: the broker URL "
                                  f"{url} names no user")
            return url
        if path is None:
            raise ConfigError(f"transport.url: broker user {parts.username!r} has no password: "
                              f"set {AMQP_URL_ENV}, transport.password_file or "
                              f"{AMQP_PASSWORD_FILE_ENV}")
        return with_password(url, read_password_file(path, "transport.password_file"))


def read_password_file(path: str | Path, what: str) -> str:
    """The password in the first line of ``path``; a ``ConfigError`` naming ``what`` and the
    file if it cannot be read or that line is empty."""
    try:
        password = next(iter(Path(path).read_text().splitlines()), "")
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"{what} {path}: cannot read it ({exc})") from None
    if not password:
        raise ConfigError(f"{what} {path}: the first line is empty")
    return password


def without_broker_password(config: JobConfig) -> JobConfig | None:
    """``config`` with the password cut out of ``transport.url``, or None if it holds none:
    what is written to run folders and handed to Prefect as a flow parameter."""
    url = config.transport.url
    if not holds_password(url):
        return None
    transport = config.transport.model_copy(update={"url": without_password(url)})
    return config.model_copy(update={"transport": transport})


class SigningConfig(_Strict):
    """Where signing keys live: ``<name>.key`` is an identity's private key (only on its own
    machine), ``<name>.pub`` the public key of every party and of ``flow``."""

    key_dir: Path
    end_to_end: bool = False
    """Encrypt every message body for its recipient (X25519 + ChaCha20-Poly1305 from the same
    keys, ``messages.e2e``) and refuse bodies that are not: for federations that do not trust
    the broker's operator. Every party and the flow of a job must set it alike."""


def _job_name(v: str) -> str:
    if not is_job_name(v):  # it names folders at every party
        raise ValueError(f"job must be {JOB_NAME_RULE}")
    return v


JobName = Annotated[str, AfterValidator(_job_name)]


class PrivacyConfig(_Strict):
    """Differential privacy of the released model, DPBoost's (``boosting.privacy``, composition
    in docs/privacy.md): rows dealt to the trees of an ensemble, gradient-based data filtering,
    the exponential mechanism for split choice, geometric leaf clipping and Laplace noise on
    leaf values. The horizontal aggregator or the vertical active party applies it."""

    epsilon: float = Field(gt=0.0, le=1000.0)
    """The whole job's budget (pure epsilon-DP of the released model with respect to one row),
    split evenly over its ensembles."""
    clip: float = Field(1.0, gt=0.0, le=1000.0)
    """DPBoost's g*: a row whose |gradient| exceeds it sits the tree out (bounds the
    sensitivity); the logistic loss's |g| < 1."""
    trees_per_ensemble: int | None = Field(None, ge=1, le=10_000)
    """Trees that share the rows between them (parallel composition); default: all the job's
    trees form one ensemble."""
    seed: int | None = Field(None, ge=0)
    """Seed of the noise, for reproducible experiments only: a known seed lets anyone who
    knows it remove the noise. Default: fresh randomness from the OS."""

    def per_ensemble(self, n_trees: int) -> int:
        """Trees per ensemble of a job growing ``n_trees`` trees."""
        return min(n_trees, self.trees_per_ensemble or n_trees)

    def spent(self, trees_done: int, n_trees: int) -> float:
        """Epsilon spent once ``trees_done`` trees are grown: each started ensemble its share
        (``boosting.privacy.PrivacyPlan.spent``, restated here: a flow imports no numpy)."""
        per = self.per_ensemble(n_trees)
        return self.epsilon / -(-n_trees // per) * -(-trees_done // per)


def _check_privacy(privacy: PrivacyConfig | None, params: _TreeParams) -> None:
    if privacy is not None and not params.reg_lambda > 0:
        raise ValueError("privacy needs params.reg_lambda > 0: the leaf sensitivity is "
                         "clip / (1 + reg_lambda) and an empty leaf's value -G / (n + lambda)")


class JobConfig(_Strict):
    """A whole federated training job (vertical SecureBoost)."""

    job: JobName
    protocol: Literal["vertical_secureboost"] = "vertical_secureboost"
    parties: dict[str, PartyConfig]
    params: ParamsConfig = ParamsConfig()
    crypto: CryptoConfig = CryptoConfig()
    validation: ValidationConfig = ValidationConfig()
    transport: TransportConfig = TransportConfig()
    signing: SigningConfig | None = None
    """Signing keys (the flow signs as ``flow``); the embedded default makes its own."""
    privacy: PrivacyConfig | None = None
    """Optional differential privacy (SecureBoost only); without it training is lossless."""

    @model_validator(mode="after")
    def _roles(self) -> JobConfig:
        _check_party_names(self.parties)
        if self.privacy is not None and self.protocol != "vertical_secureboost":
            raise ValueError(f"privacy: {self.protocol} has no differential privacy")
        _check_privacy(self.privacy, self.params)
        actives = [n for n, p in self.parties.items() if p.role == "active"]
        if len(actives) != 1:
            raise ValueError(f"exactly one party must have role active, found {len(actives)}")
        if not self.passives:
            raise ValueError("at least one party must have role passive")
        if self.parties[actives[0]].label is None:
            raise ValueError(f"parties.{actives[0]}.label: the active party needs a label column")
        if getattr(self.params, "early_stopping_rounds", None) and not self.validation.fraction:
            raise ValueError("params.early_stopping_rounds stops on validation rows: set "
                             "validation.fraction (e.g. 0.2)")
        for name in self.passives:
            if self.parties[name].label is not None:
                raise ValueError(f"parties.{name}.label: only the active party holds labels")
        _check_broker_needs(self.transport, self.signing, self.parties, list(self.parties))
        return self

    @property
    def active(self) -> str:
        """Name of the active party."""
        return next(n for n, p in self.parties.items() if p.role == "active")

    @property
    def passives(self) -> list[str]:
        """Names of the passive parties, in file order."""
        return [n for n, p in self.parties.items() if p.role == "passive"]


def _check_party_names(parties: dict[str, Any]) -> None:
    for name in parties:
        if not re.fullmatch(NAME_PATTERN, name) or name == "flow":
            raise ValueError(f"party name {name!r} must be 1-32 letters, digits, '_', '-' "
                             f"(and not 'flow')")


def _check_broker_needs(transport: TransportConfig, signing: SigningConfig | None,
                        parties: dict[str, Any], needs_data: list[str]) -> None:
    """Over RabbitMQ every message is signed; the embedded default reads every data file."""
    if transport.kind == "rabbitmq" and signing is None:
        raise ValueError("signing.key_dir: parties and flows over RabbitMQ sign every "
                         "message; make keys with 'fedboost keys --out DIR --name PARTY'")
    if transport.kind == "memory":
        for name in needs_data:
            if parties[name].data is None:
                raise ValueError(f"parties.{name}.data: the embedded default needs every "
                                 f"party's data file")
    for name, party in parties.items():
        if party.data is not None and party.dataset is not None:
            raise ValueError(f"parties.{name}: give data (a file, embedded default) or dataset "
                             f"(a name in the party's worker file), not both")


def _check_row_partitioned(parties: dict[str, HorizontalPartyConfig], fewest: int,
                           why: str) -> None:
    """One aggregator without data, at least ``fewest`` members, each with its label."""
    aggregators = [n for n, p in parties.items() if p.role == "aggregator"]
    if len(aggregators) != 1:
        raise ValueError(f"exactly one party must have role aggregator, found {len(aggregators)}")
    for key in ("data", "dataset", "label", "columns"):
        if getattr(parties[aggregators[0]], key) is not None:
            raise ValueError(f"parties.{aggregators[0]}.{key}: the aggregator holds no data")
    members = [n for n, p in parties.items() if p.role == "member"]
    if len(members) < fewest:
        raise ValueError(f"{len(members)} member(s): {why}")
    for name in members:
        if parties[name].label is None:
            raise ValueError(f"parties.{name}.label: every member needs the label column")


class HorizontalParamsConfig(_NoEarlyStopping, _TreeParams):
    """Boosting parameters of the horizontal protocol (multiclass: one tree per class per
    round; members' labels 0..255)."""


class HorizontalPartyConfig(_Strict):
    """A party of a horizontal job: a member (rows with labels) or the aggregator."""

    role: Literal["member", "aggregator"]
    data: Path | None = None
    """A member's CSV file (embedded default)."""
    dataset: str | None = Field(None, pattern=f"^{NAME_PATTERN}$")
    """Over a broker: the data set's name in the member's own worker file."""
    id: str = "id"
    label: str | None = None
    columns: list[str] | None = None
    """Feature columns (default: all but id and label); every member's must be the same."""
    policy: PolicyConfig | None = None


class _MembersAndAggregator:
    """The parties of a job whose members hold rows and one aggregator holds none (the
    schema's own ``parties`` field)."""

    @property
    def aggregator(self) -> str:
        """Name of the aggregator."""
        parties: dict[str, HorizontalPartyConfig] = getattr(self, "parties")
        return next(n for n, p in parties.items() if p.role == "aggregator")

    @property
    def members(self) -> list[str]:
        """Names of the members, in file order."""
        parties: dict[str, HorizontalPartyConfig] = getattr(self, "parties")
        return [n for n, p in parties.items() if p.role == "member"]


class HorizontalJobConfig(_MembersAndAggregator, _Strict):
    """A horizontal training job (FedTree): members with different rows and the same columns,
    one aggregator that sums their masked histograms and grows the trees."""

    job: JobName
    protocol: Literal["horizontal"]
    parties: dict[str, HorizontalPartyConfig]
    params: HorizontalParamsConfig = HorizontalParamsConfig()
    privacy: PrivacyConfig | None = None
    """Optional differential privacy; without it the protocol is lossless."""
    min_members: int = Field(2, ge=2, le=1000)
    """Members that must remain: below this (after dropouts) the job fails."""
    transport: TransportConfig = TransportConfig()
    signing: SigningConfig | None = None

    @model_validator(mode="after")
    def _roles(self) -> HorizontalJobConfig:
        _check_party_names(self.parties)
        _check_row_partitioned(self.parties, self.min_members,
                               f"min_members is {self.min_members}: secure aggregation needs at "
                               f"least 2")
        _check_privacy(self.privacy, self.params)
        _check_broker_needs(self.transport, self.signing, self.parties, self.members)
        return self

class LshConfig(_Strict):
    """SimFL's p-stable LSH (the paper's defaults)."""

    functions: int | None = Field(None, ge=1, le=1000)
    """Hash functions L (default min(40, d - 1), d the number of features)."""
    r: float = Field(4.0, gt=0.0, le=1e6)
    """Bucket width."""
    seed: int = Field(0, ge=0)
    """Part of the preprocessing's key: another seed gives other functions. The projections
    themselves come from a secret the members agree on (never from this seed or from data)."""


class SimflPrivacyConfig(_Strict):
    """The noise a member adds to the gradient sums it sends a builder
    (``workers.simfl.privacy``); it cannot be switched off."""

    label_noise: float = Field(4.0, ge=1.0, le=1000.0)
    """sigma_label: per builder row, drawn once per preprocessing, in units of ``clip``
    (members refuse less than 1)."""
    tree_noise: float = Field(8.0, ge=1.0, le=1000.0)
    """sigma_tree: drawn anew per tree, in units of ``clip`` (g) and of the hessian's bound
    (members refuse less than 1)."""
    clip: float = Field(1.0, gt=0.0, le=1e6)
    """Regression: each row's g is clipped to [-clip, clip] before it is summed. Binary: not
    used (the logistic loss's |g| < 1 is its own bound)."""
    delta: float = Field(1e-5, gt=0.0, lt=1.0)
    """The delta of the (epsilon, delta) the job reports (``metrics.json``: ``privacy``)."""


class SimflParamsConfig(_NoEarlyStopping, _TreeParams):
    """Boosting parameters of SimFL, with its LSH (multiclass: one tree per class per round,
    grown by the round's builder; members' labels 0..255, at least two classes each)."""

    lsh: LshConfig = LshConfig()
    privacy: SimflPrivacyConfig = SimflPrivacyConfig()


class SimflJobConfig(_MembersAndAggregator, _Strict):
    """A SimFL job (seed 000): members with different rows and the same columns exchange LSH
    values once, through an aggregator, then take turns growing trees on weighted gradients."""

    job: JobName
    protocol: Literal["simfl"]
    parties: dict[str, HorizontalPartyConfig]
    params: SimflParamsConfig = SimflParamsConfig()
    transport: TransportConfig = TransportConfig()
    signing: SigningConfig | None = None

    @model_validator(mode="after")
    def _roles(self) -> SimflJobConfig:
        _check_party_names(self.parties)
        _check_row_partitioned(self.parties, 2, "SimFL needs at least 2 members")
        _check_broker_needs(self.transport, self.signing, self.parties, self.members)
        return self


class ForestParamsConfig(_NoEarlyStopping, _Strict):
    """The vertical random forest's parameters (seed 002)."""

    why_no_early_stopping: ClassVar[str] = ("a forest's trees are independent and averaged, grown in "
                              "parallel: none is a stage to stop after")

    n_trees: int = Field(50, ge=1, le=10_000)
    max_depth: int = Field(10, ge=1, le=16)
    max_features: Literal["sqrt", "log2"] | float = "sqrt"
    """Features drawn per node: sqrt or log2 of all the parties' features, or a fraction."""
    min_samples_leaf: int = Field(1, ge=1)
    max_bin: int = Field(32, ge=2, le=254)
    objective: Literal["binary", "multiclass", "regression"] = "binary"
    bootstrap: bool = True
    seed: int = Field(0, ge=0)
    complete_secure: bool = False
    """The first tree grows on the active party's features alone (no passive party sees its
    instance spaces), as Completely SecureBoost's first round."""
    min_trees: int | None = Field(None, ge=1)
    """Fewest trees the job may finish with when trees are dropped (default: all)."""
    tree_retries: int = Field(2, ge=0, le=10)
    """Times a failed tree is grown again before it is dropped."""
    parallel_trees: int = Field(2, ge=1, le=64)
    """Trees grown at once (Prefect task concurrency)."""

    @field_validator("max_features")
    @classmethod
    def _fraction(cls, v: str | float) -> str | float:
        if isinstance(v, float) and not 0.0 < v <= 1.0:
            raise ValueError("a fraction of the features must be in (0, 1]")
        return v

    @model_validator(mode="after")
    def _enough(self) -> ForestParamsConfig:
        if self.min_trees is not None and self.min_trees > self.n_trees:
            raise ValueError(f"min_trees {self.min_trees} exceeds n_trees {self.n_trees}")
        return self


class ForestJobConfig(JobConfig):
    """A vertical random forest job: parties as for SecureBoost."""

    protocol: Literal["vertical_random_forest"]  # type: ignore[assignment]
    params: ForestParamsConfig = ForestParamsConfig()  # type: ignore[assignment]


AnyJobConfig = JobConfig | HorizontalJobConfig | SimflJobConfig | ForestJobConfig


def job_schemas() -> dict[str, type[Any]]:
    """protocol -> its job file's schema, as the protocols declare them (``flows.declared``)."""
    from flows.declared import declared  # late: the declarations import the schemas above
    return {name: protocol.schema for name, protocol in declared().items()}


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path}: cannot parse ({exc})") from None


def load_config(path: str | Path) -> AnyJobConfig:
    """Read, validate and resolve a job file."""
    path = Path(path)
    return parse_config(_read_yaml(path), base=path.resolve().parent, source=str(path))


def validate_job(raw: Any, source: str) -> AnyJobConfig:
    """A job mapping validated against its protocol's schema (``protocol:``, default
    vertical_secureboost); keys that protocol does not have are errors naming them."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {source}: expected a mapping at the top level")
    protocol = raw.get("protocol", "vertical_secureboost")
    schemas = job_schemas()
    schema = schemas.get(protocol) if isinstance(protocol, str) else None
    if schema is None:
        raise ConfigError(f"config file {source}: key 'protocol': {protocol!r} is not a "
                          f"protocol (known: {', '.join(schemas)})")
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"config file {source}: {describe(exc)}") from None


def parse_config(raw: Any, *, base: Path, source: str) -> AnyJobConfig:
    """Validate a config mapping; data paths are made absolute against ``base``."""
    config = validate_job(raw, source)
    parties = {name: p.model_copy(update={"data": _resolve(base, p.data)})
               for name, p in config.parties.items()}
    signing = config.signing and config.signing.model_copy(
        update={"key_dir": _resolve(base, config.signing.key_dir)})
    return config.model_copy(update={"parties": parties, "signing": signing,
                                     "transport": _resolve_transport(base, config.transport)})


def _resolve(base: Path, path: Path | None) -> Path | None:
    return path if path is None or path.is_absolute() else base / path


def _resolve_transport(base: Path, transport: TransportConfig) -> TransportConfig:
    """The transport's file paths (TLS files, password file) made absolute against ``base``."""
    return transport.model_copy(update={
        "tls": transport.tls and transport.tls.resolved(base),
        "password_file": _resolve(base, transport.password_file)})


class DataSetConfig(_Strict):
    """One of a party's data files, named in its worker file's ``datasets:``."""

    data: Path
    id: str = "id"
    label: str | None = None
    columns: list[str] | None = None
    categorical: list[str] | None = None
    """Feature columns of text this party encodes itself (vertical jobs)."""


class WorkerConfig(_Strict):
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
    raw = _read_yaml(path)
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
               "policy": entry.policy or PolicyConfig(protocols=[job.protocol]),
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
    datasets = {name: d.model_copy(update={"data": _resolve(base, d.data)})
                for name, d in config.datasets.items()}
    return config.model_copy(update={"data": _resolve(base, config.data),
                                     "datasets": datasets,
                                     "models": _resolve(base, config.models),
                                     "state": _resolve(base, config.state),
                                     "transport": _resolve_transport(base, config.transport),
                                     "signing": config.signing.model_copy(update={
                                         "key_dir": _resolve(base, config.signing.key_dir)})})


def describe(exc: ValidationError) -> str:
    """One line per problem, each naming its key."""
    parts = []
    for err in exc.errors():
        key = ".".join(str(x) for x in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key {key!r}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"key {key!r}: {msg}" if err["loc"] else msg)
    return "; ".join(parts)
