"""A broker's AMQP URL: where it points (for messages), and its password, which must be kept out
of files and logs."""

from __future__ import annotations

from typing import TypeGuard
from urllib.parse import quote, urlsplit, urlunsplit


def host_of(url: str) -> str:
    """'host:port' of an AMQP URL (default ports filled in), for messages."""
    parts = urlsplit(url)
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    return f"{parts.hostname or 'localhost'}:{port}"


def holds_password(url: str | None) -> TypeGuard[str]:
    """True if ``url`` carries a password (which must then be kept out of files and logs)."""
    return url is not None and urlsplit(url).password is not None


def redact(url: str) -> str:
    """The URL without its password, for logs and errors."""
    return _with_userinfo(url, "***") if holds_password(url) else url


def without_password(url: str) -> str:
    """The URL with its user but no password: what may be written to files and Prefect."""
    return _with_userinfo(url, None)


def with_password(url: str, password: str) -> str:
    """The URL with ``password`` (e.g. read from a password file) for its user."""
    return _with_userinfo(url, quote(password, safe=""))


def _with_userinfo(url: str, password: str | None) -> str:
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return url
    user = userinfo.partition(":")[0]
    netloc = f"{user}@{hostport}" if password is None else f"{user}:{password}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc))
