"""How a job or a worker reaches the broker: its URL and password, TLS, and signing keys."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from flows.schema_base import ConfigError, Strict, resolve_path
from messages.broker_url import with_password
from messages.tls import TlsOptions


AMQP_URL_ENV = "FEDBOOST_AMQP_URL"
"""Overrides ``transport.url``: keeps broker passwords out of shared job files."""


AMQP_PASSWORD_FILE_ENV = "FEDBOOST_AMQP_PASSWORD_FILE"
"""Overrides ``transport.password_file``."""


DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


class TlsConfig(Strict):
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
        return self.model_copy(update={key: resolve_path(base, getattr(self, key))
                                       for key in ("ca_file", "cert_file", "key_file")})

    def options(self) -> TlsOptions:
        """The settings as ``messages.rabbitmq.RabbitTransport`` takes them."""
        def text(path: Path | None) -> str | None:
            return None if path is None else str(path)
        return TlsOptions(ca_file=text(self.ca_file), cert_file=text(self.cert_file),
                          key_file=text(self.key_file), server_hostname=self.server_hostname)


class TransportConfig(Strict):
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
        from_env = os.environ.get(AMQP_PASSWORD_FILE_ENV)
        path = from_env or self.password_file
        if parts.username is None:
            if path is not None:
                raise ConfigError(f"transport.password_file {path}: the broker URL "
                                  f"{url} names no user")
            return url
        if path is None:
            raise ConfigError(f"transport.url: broker user {parts.username!r} has no password: "
                              f"set {AMQP_URL_ENV}, transport.password_file or "
                              f"{AMQP_PASSWORD_FILE_ENV}")
        return with_password(url, read_password_file(
            path, AMQP_PASSWORD_FILE_ENV if from_env else "transport.password_file"))


def read_password_file(path: str | Path, what: str) -> str:
    """The password in the first line of ``path``; a ``ConfigError`` naming ``what`` and the
    file if it cannot be read, other users may read or write it (as ssh refuses such a key
    file: the password would already be theirs), or that line is empty."""
    try:
        mode = Path(path).stat().st_mode
        password = next(iter(Path(path).read_text().splitlines()), "")
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"{what} {path}: cannot read it ({exc})") from None
    if mode & 0o077:
        raise ConfigError(f"{what} {path}: other users may read it (mode {mode & 0o777:04o}); "
                          f"make it yours alone: chmod 600 {path}")
    if not password:
        raise ConfigError(f"{what} {path}: the first line is empty")
    return password


class SigningConfig(Strict):
    """Where signing keys live: ``<name>.key`` is an identity's private key (only on its own
    machine), ``<name>.pub`` the public key of every party and of ``flow``."""

    key_dir: Path
    end_to_end: bool = False
    """Encrypt every message body for its recipient (X25519 + ChaCha20-Poly1305 from the same
    keys, ``messages.e2e``) and refuse bodies that are not: for federations that do not trust
    the broker's operator. Every party and the flow of a job must set it alike."""


def resolve_transport(base: Path, transport: TransportConfig) -> TransportConfig:
    """The transport's file paths (TLS files, password file) made absolute against ``base``."""
    return transport.model_copy(update={
        "tls": transport.tls and transport.tls.resolved(base),
        "password_file": resolve_path(base, transport.password_file)})
