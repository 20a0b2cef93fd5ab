"""What every protocol's job file shares: parties and their policy, the tree parameters, the
job's name, differential privacy, and the checks of who holds what.

Each protocol's own schema sits beside its declaration (``flows.declared.<protocol>``).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, create_model, model_validator

from flows.broker_settings import SigningConfig, TransportConfig
from flows.declared import declared
from flows.schema_base import NAME_PATTERN, Strict
from messages.names import JOB_NAME_RULE, is_job_name
from messages.params import TreeParams
from messages.policy import ROLES, PartyPolicy


class JobFile(typing.Protocol):
    """What the run owner and the coordinator read of any protocol's job file: every schema
    has it, a plug-in's (``FEDBOOST_PROTOCOLS``) too."""

    @property
    def job(self) -> str: ...

    @property
    def protocol(self) -> str: ...

    @property
    def parties(self) -> typing.Mapping[str, Any]: ...

    @property
    def transport(self) -> TransportConfig: ...

    @property
    def signing(self) -> SigningConfig | None: ...


def _known_protocol(name: str) -> str:
    known = declared()
    if name not in known:
        raise ValueError(f"{name!r} is not a protocol (known: {', '.join(known)})")
    return name


Protocol = Annotated[str, AfterValidator(_known_protocol)]
"""A protocol's name, as a job file's ``protocol:`` gives it (``flows.declared`` knows them all)."""


def schema_fields(cls: type, kinds: dict[str, Any] | None = None) -> dict[str, Any]:
    """``create_model`` fields made from a dataclass's fields: each one's type (``Literal`` of
    its choices, a list of ``Literal`` for a tuple of choices (``each_of``), a list for any
    other tuple, or ``kinds[name]`` where the file says more than the dataclass checks), its
    default and its bounds, as the dataclass declares them (``boosting.params.bounds``)."""
    hints = typing.get_type_hints(cls)

    def kind_of(f: dataclasses.Field[Any]) -> Any:
        if f.name in (kinds or {}):
            return (kinds or {})[f.name]
        if "choices" in f.metadata:
            return Literal[f.metadata["choices"]]
        if "each_of" in f.metadata:
            return types.GenericAlias(list, (Literal[f.metadata["each_of"]],))
        if typing.get_origin(hints[f.name]) is tuple:
            return types.GenericAlias(list, typing.get_args(hints[f.name])[:1])
        return hints[f.name]

    def one(f: dataclasses.Field[Any]) -> tuple[Any, Any]:
        limits = f.metadata.get("bounds", {})
        if f.default_factory is not dataclasses.MISSING:
            return kind_of(f), Field(default_factory=f.default_factory, **limits)
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        return kind_of(f), Field(default, **limits)

    return {f.name: one(f) for f in dataclasses.fields(cls)}


if typing.TYPE_CHECKING:  # the fields create_model gives PolicyConfig below: PartyPolicy's
    _PolicyFields = PartyPolicy
else:
    _PolicyFields = object


_ROLE: Any = Literal[ROLES]
"""A role a policy names (``Literal`` of ``messages.policy.ROLES``)."""


class _PolicyBase(Strict, _PolicyFields):
    def party_policy(self) -> PartyPolicy:
        """The policy as the party's worker holds it (``messages.policy``): lists become
        tuples, nothing else changes."""
        settings: dict[str, Any] = {
            name: (tuple(value) if isinstance(value, list) else
                   {k: tuple(v) for k, v in value.items()} if isinstance(value, dict) else value)
            for name, value in self.model_dump().items()}
        return PartyPolicy(**settings)


PolicyConfig: type[_PolicyBase] = create_model(
    "PolicyConfig", __base__=_PolicyBase,
    __doc__="A party's own policy (``messages.policy.PartyPolicy``): what its worker accepts.",
    **schema_fields(PartyPolicy, {"protocols": list[Protocol],
                                  "roles": dict[Protocol, list[_ROLE]]}))


class PartyConfig(Strict):
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


if typing.TYPE_CHECKING:  # the fields create_model gives TreeParamsConfig below: TreeParams's
    _TreeParamsFields = TreeParams
else:
    _TreeParamsFields = object


class _TreeParamsBase(Strict, _TreeParamsFields):
    def tree_params(self) -> TreeParams:
        """The parameters as every opener carries them (``messages.params``)."""
        return TreeParams(**self.model_dump(include=set(TREE_PARAMS)))


TREE_PARAMS = {f.name: f for f in dataclasses.fields(TreeParams)}


TreeParamsConfig: type[_TreeParamsBase] = create_model(
    "TreeParamsConfig", __base__=_TreeParamsBase,
    __doc__="Boosting parameters every protocol shares (``messages.params.TreeParams``).",
    **schema_fields(TreeParams))


class NoEarlyStopping:
    """Protocols without a validation set refuse ``early_stopping_rounds`` with the reason."""

    why_no_early_stopping: ClassVar[str] = "its label holders hold out no validation rows"

    @model_validator(mode="before")
    @classmethod
    def _no_early_stopping(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "early_stopping_rounds" in raw:
            raise ValueError(f"early_stopping_rounds: not available in this protocol: "
                             f"{cls.why_no_early_stopping}")
        return raw


def _job_name(v: str) -> str:
    if not is_job_name(v):  # it names folders at every party
        raise ValueError(f"job must be {JOB_NAME_RULE}")
    return v


JobName = Annotated[str, AfterValidator(_job_name)]


class PrivacyConfig(Strict):
    """Differential privacy of the released model, DPBoost's (``boosting.privacy``, composition
    in docs/privacy.md): rows dealt to the trees of an ensemble, gradient clipping, the
    exponential mechanism for split choice, geometric leaf clipping and Laplace noise on
    leaf values. The horizontal aggregator or the vertical active party applies it."""

    epsilon: float = Field(gt=0.0, le=1000.0)
    """The whole job's budget (pure epsilon-DP of the released model with respect to one row),
    split evenly over its ensembles."""
    clip: float = Field(1.0, gt=0.0, le=1000.0)
    """DPBoost's g*: every row's gradient is clipped to [-clip, clip] (bounds the
    sensitivity); the logistic loss's |g| < 1, so 1 clips nothing there; 0.3 was best on
    default_credit (docs/privacy.md)."""
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


def check_privacy(privacy: PrivacyConfig | None, params: TreeParamsConfig) -> None:
    if privacy is not None and not params.reg_lambda > 0:
        raise ValueError("privacy needs params.reg_lambda > 0: the leaf sensitivity is "
                         "clip / (1 + reg_lambda) and an empty leaf's value -G / (n + lambda)")


def check_party_names(parties: dict[str, Any]) -> None:
    for name in parties:
        if not re.fullmatch(NAME_PATTERN, name) or name == "flow":
            raise ValueError(f"party name {name!r} must be 1-32 letters, digits, '_', '-' "
                             f"(and not 'flow')")


def check_broker_needs(transport: TransportConfig, signing: SigningConfig | None,
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


def check_row_partitioned(parties: dict[str, HorizontalPartyConfig], fewest: int,
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


class HorizontalPartyConfig(Strict):
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


class MembersAndAggregator:
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
