"""TLS to the broker: what every RabbitMQ connection of a participant presents and verifies.

An ``amqps://`` URL always verifies the broker: its certificate must chain to the given CA (or,
without one, to the system's CA store) and name the host the client expects (``server_hostname``,
default the URL's host). There is deliberately no switch that turns either check off: a
participant that skips them hands its password and every message to whoever answers on the
broker's address. A client certificate (``cert_file`` + ``key_file``) lets a broker that asks for
one (``ssl_options.fail_if_no_peer_cert = true``) refuse anyone without a certificate from the
federation's CA before the AMQP login is even read.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pika

from messages import TransportError


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """A participant's TLS settings (``transport.tls`` in job and worker files)."""

    ca_file: str | None = None
    """CA certificate(s) the broker's certificate must chain to (None: the system's store)."""
    cert_file: str | None = None
    """This participant's client certificate (PEM), presented to the broker."""
    key_file: str | None = None
    """The client certificate's private key (PEM)."""
    server_hostname: str | None = None
    """The name the broker's certificate must carry (None: the URL's host)."""


def ssl_options_for(owner: str, url: str, tls: TlsOptions | None) -> pika.SSLOptions | None:
    """The pika TLS settings for ``url``: None for a plain ``amqp://`` URL without ``tls``.

    Raises
    ------
    TransportError
        ``tls`` given with a plain ``amqp://`` URL, TLS options smuggled into the URL's query,
        or certificate files that cannot be read; each names ``owner`` and the file or key.
    """
    parts = urlsplit(url)
    if "ssl_options" in parse_qs(parts.query):
        # pika would pass these to the socket as given, verification switches included
        raise TransportError(f"{owner}: the broker URL must not carry ssl_options; "
                             f"set transport.tls instead")
    if parts.scheme != "amqps":
        if tls is not None:
            raise TransportError(f"{owner}: transport.tls needs an amqps:// broker URL; "
                                 f"the URL in use is {parts.scheme}://")
        return None
    tls = tls or TlsOptions()
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TransportError(f"{owner}: transport.tls.ca_file {tls.ca_file}: cannot load "
                             f"({exc})") from None
    # create_default_context verifies the chain and the name; say so where it matters
    context.verify_mode, context.check_hostname = ssl.CERT_REQUIRED, True
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.cert_file is not None:
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"{owner}: transport.tls.cert_file {tls.cert_file} / key_file "
                                 f"{tls.key_file}: cannot load ({exc})") from None
    return pika.SSLOptions(context, tls.server_hostname or parts.hostname)


def certificate_problem(exc: BaseException) -> str | None:
    """What went wrong if a failed connection attempt was a TLS certificate check, else None.

    Such a failure will not heal by retrying: the broker's certificate (or ours) is wrong. pika
    raises the client's own verification failure as ``ssl.SSLCertVerificationError``, and the
    broker's refusal of our certificate as a lost stream whose text carries the TLS alert.
    """
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ssl.SSLCertVerificationError):
            return f"the broker's certificate failed verification ({item.verify_message})"
        stack.extend([*item.args, item.__cause__, item.__context__])
    alert = _REFUSED.search(repr(exc))
    if alert:
        return f"the broker refused this participant's TLS client certificate ({alert[0]})"
    return None


_REFUSED = re.compile(r"ALERT_(CERTIFICATE_\w+|UNKNOWN_CA|BAD_CERTIFICATE|"
                      r"UNSUPPORTED_CERTIFICATE|ACCESS_DENIED)")
"""TLS alerts (as OpenSSL names them) by which a broker refuses a client's certificate."""
