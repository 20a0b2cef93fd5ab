"""Job files (YAML), validated with pydantic at the edge: reading one and checking it against its
protocol's schema.

Unknown keys and bad values are errors that name the key; relative data paths resolve against
the config file's folder. The schemas live where they are declared: what every job shares in
``flows.job_schema``, the broker's settings in ``flows.broker_settings``, each protocol's own
beside its declaration (``flows.declared.<protocol>``), a worker's own file in
``flows.worker_config``. This module re-exports the names users and tests import from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flows.broker_settings import (AMQP_PASSWORD_FILE_ENV, AMQP_URL_ENV, DEFAULT_AMQP_URL,
                                   SigningConfig, TlsConfig, TransportConfig, read_password_file,
                                   resolve_transport)
from flows.declared import declared
from flows.declared.forest import ForestJobConfig, ForestParamsConfig
from flows.declared.horizontal import HorizontalJobConfig, HorizontalParamsConfig
from flows.declared.secureboost import (CryptoConfig, JobConfig, ParamsConfig, SecureBoostJobConfig,
                                       ValidationConfig, VerticalJobConfig)
from flows.declared.simfl import LshConfig, SimflJobConfig, SimflParamsConfig, SimflPrivacyConfig
from flows.job_schema import (TREE_PARAMS, HorizontalPartyConfig, JobFile, JobName, PartyConfig,
                              PolicyConfig, PrivacyConfig, Protocol, TreeParamsConfig)
from flows.schema_base import NAME_PATTERN, ConfigError, describe, read_yaml, resolve_path
from messages.broker_url import holds_password, without_password

__all__ = [
    "AMQP_PASSWORD_FILE_ENV", "AMQP_URL_ENV", "DEFAULT_AMQP_URL", "NAME_PATTERN", "TREE_PARAMS",
    "AnyJobConfig", "ConfigError", "CryptoConfig", "ForestJobConfig", "ForestParamsConfig",
    "HorizontalJobConfig", "HorizontalParamsConfig", "HorizontalPartyConfig", "JobConfig",
    "JobFile", "JobName", "LshConfig", "ParamsConfig", "PartyConfig", "PolicyConfig", "PrivacyConfig",
    "Protocol", "SecureBoostJobConfig", "SigningConfig", "SimflJobConfig", "SimflParamsConfig", "SimflPrivacyConfig",
    "TlsConfig", "TransportConfig", "TreeParamsConfig", "ValidationConfig", "VerticalJobConfig",
    "describe",
    "job_schemas", "load_config", "parse_config", "read_password_file", "validate_job",
    "without_broker_password"]


AnyJobConfig = SecureBoostJobConfig | HorizontalJobConfig | SimflJobConfig | ForestJobConfig
"""fedboost's own protocols' job files; code that takes any protocol's (a plug-in's too) reads
a ``JobFile``."""


def job_schemas() -> dict[str, type[Any]]:
    """protocol -> its job file's schema, as the protocols declare them (``flows.declared``)."""
    return {name: protocol.schema for name, protocol in declared().items()}


def load_config(path: str | Path) -> AnyJobConfig:
    """Read, validate and resolve a job file."""
    path = Path(path)
    return parse_config(read_yaml(path), base=path.resolve().parent, source=str(path))


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
    parties = {name: p.model_copy(update={"data": resolve_path(base, p.data)})
               for name, p in config.parties.items()}
    signing = config.signing and config.signing.model_copy(
        update={"key_dir": resolve_path(base, config.signing.key_dir)})
    return config.model_copy(update={"parties": parties, "signing": signing,
                                     "transport": resolve_transport(base, config.transport)})


def without_broker_password(config: AnyJobConfig) -> AnyJobConfig | None:
    """``config`` with the password cut out of ``transport.url``, or None if it holds none:
    what is written to run folders and handed to Prefect as a flow parameter."""
    url = config.transport.url
    if not holds_password(url):
        return None
    transport = config.transport.model_copy(update={"url": without_password(url)})
    return config.model_copy(update={"transport": transport})
