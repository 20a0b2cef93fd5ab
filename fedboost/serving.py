"""``fedboost serve-model``: a real-time scoring API over the parties' running workers.

The command opens a scoring session at every party's worker (``fedboost.scoring_link``) and
serves ``POST /v1/score``, ``GET /healthz``, ``/readyz`` and ``/metrics``
(``fedboost.scoring_api``) with uvicorn (``fedboost.scoring_http``) until SIGTERM or Ctrl-C:
then it stops accepting connections, finishes the requests in flight, closes the session at
every party and deletes its reply queue.

Clients authenticate with API keys (``--api-keys``, ``fedboost.api_keys``) and/or client
certificates (``--tls-client-ca``); serving without either needs ``--insecure-no-auth``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

from workers.model_folder import RunFolder

DEFAULT_MAX_IDS = 1000
DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_RATE = 500.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def add_command(sub: Any) -> None:
    """``fedboost serve-model`` (and ``serve-model-keys``) on the CLI's subcommands."""
    from fedboost.api_keys import add_command as add_keys_command

    cmd = sub.add_parser("serve-model", help="serve a trained vertical model over HTTP "
                         "(POST /v1/score), scoring rows by id at the parties' running workers")
    cmd.add_argument("model_dir", type=Path, help="run folder written by 'fedboost train' "
                     "over RabbitMQ (its job.json)")
    cmd.add_argument("--port", type=int, required=True,
                     help="TCP port to listen on (e.g. 8443)")
    cmd.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                     "127.0.0.1)")
    cmd.add_argument("--dataset", action="append", default=[], metavar="PARTY=NAME",
                     help="the data set (in PARTY's worker file) whose rows are scored by id "
                          "(default: the one the job trained on)")
    cmd.add_argument("--max-ids", type=int, default=DEFAULT_MAX_IDS,
                     help=f"ids per request at most (default {DEFAULT_MAX_IDS})")
    cmd.add_argument("--round-rows", type=int, default=4096,
                     help="rows per round at most: concurrent requests are batched up to it")
    cmd.add_argument("--in-flight", type=int, default=2, help="rounds out at once (default 2)")
    cmd.add_argument("--timeout", type=float, default=10.0,
                     help="seconds a round may take before the silent parties are named in a "
                          "503 (default 10)")
    cmd.add_argument("--request-timeout", type=float, help="seconds a request may wait for its "
                     "scores at most, then 504 (default: 3 x --timeout: a reopened session, a "
                     "membership round and a scoring round)")
    auth = cmd.add_argument_group("authentication and TLS")
    auth.add_argument("--api-keys", type=Path, metavar="FILE", help="clients authenticate "
                      "with a key of this file (made with 'fedboost serve-model-keys'; reread "
                      "when it changes): 'Authorization: Bearer <key>'")
    auth.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this "
                      "certificate (chain)")
    auth.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")
    auth.add_argument("--tls-client-ca", type=Path, metavar="PEM", help="clients present a "
                      "certificate signed by this CA (mutual TLS; its CN names the client)")
    auth.add_argument("--tls-crl", type=Path, metavar="PEM", help="with --tls-client-ca: "
                      "client certificates this certificate revocation list names are refused "
                      "(the CA's CRL; reread when it changes, as the other TLS files are)")
    auth.add_argument("--tls-min-version", choices=("1.2", "1.3"), default="1.2",
                      help="the oldest TLS version a client may use (default 1.2)")
    auth.add_argument("--tls-ciphers", metavar="LIST", help="OpenSSL cipher list for TLS 1.2 "
                      "(default: Python's; TLS 1.3 suites are OpenSSL's)")
    auth.add_argument("--insecure-no-auth", action="store_true", help="serve scores to anyone "
                      "who can reach the port (no key, no client certificate)")
    auth.add_argument("--allowed-host", action="append", default=[], metavar="HOST",
                      help="a Host header value to accept (repeat; default: --host and "
                           "localhost)")
    limits = cmd.add_argument_group("limits")
    limits.add_argument("--max-body-bytes", type=int, help="request body size at most "
                        "(default: what --max-ids ids of 256 characters need)")
    limits.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help=f"open connections at most (default {DEFAULT_MAX_CONNECTIONS}): "
                             f"beyond it the one sending its request the longest is closed")
    limits.add_argument("--rate", type=float, default=DEFAULT_RATE, help="requests per second "
                        f"per client (default {DEFAULT_RATE:g}; bursts of two seconds' worth; "
                        f"a key may set its own): beyond it 429 with Retry-After")
    limits.add_argument("--header-timeout", type=float, default=10.0, help="seconds a client "
                        "has to send a request's headers (default 10)")
    limits.add_argument("--body-timeout", type=float, default=10.0, help="seconds a client has "
                        "to send a request's body (default 10)")
    limits.add_argument("--tls-handshake-timeout", type=float, default=5.0, help="seconds a "
                        "client has to finish its TLS handshake (default 5); a connection "
                        "counts against --max-connections from its accept, handshake included")
    cmd.add_argument("--access-log", default="-", metavar="FILE", help="JSON access log lines "
                     "to FILE ('-': stderr, the default; 'off': none)")
    cmd.set_defaults(run=serve_model)
    add_keys_command(sub)


class _Stop:
    """SIGTERM or SIGINT outside uvicorn's own handling (while the session opens, or when
    uvicorn, having drained, raises the signal again): stop after the step under way, never in
    the middle of a broker call, so the session is always closed."""

    def __init__(self) -> None:
        self.requested = False
        self.server: Any = None
        self.link_died = False

    def link_stopped(self) -> None:
        """The scoring link ended on a failure (its thread): stop serving, exit non-zero."""
        self.link_died = True
        if self.server is not None:
            self.server.should_exit = True

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self.server is not None:
            self.server.should_exit = True  # uvicorn has not taken the signals over yet


def serve_model(args: argparse.Namespace) -> int:
    """Open the scoring session, serve HTTP until SIGTERM or Ctrl-C, close the session."""
    from workers.runtime import SWITCH_INTERVAL

    from fedboost.exit_codes import EXIT_SERVICE_FAILED
    from fedboost.scoring_link import ScoringLink
    from fedboost.scoring_session import SessionPlan
    from fedboost.scoring_metrics import ScoringMetrics
    from flows.coordinator import PartyError, StepTimeout, broker_coordinator
    from messages import TransportError
    from flows.config import ConfigError

    if (not 1 <= args.max_ids <= args.round_rows or args.in_flight < 1 or args.timeout <= 0
            or (args.request_timeout is not None and args.request_timeout <= 0)):
        raise ConfigError("--max-ids must be 1 to --round-rows, --in-flight at least 1 and "
                          "--timeout and --request-timeout positive")
    from fedboost.scoring_http import ServerTLS

    policy, hosts, limits = _guards(args)
    tls = None if args.tls_cert is None else ServerTLS(
        lambda: tls_context(args), [p for p in (args.tls_cert, args.tls_key, args.tls_client_ca,
                                                args.tls_crl) if p is not None])
    config = _job_of(args.model_dir)
    listening = listening_socket(args.host, args.port)  # a port in use fails here, at once
    plan = SessionPlan(job=f"{config.job[:40]}-serve-{uuid.uuid4().hex[:8]}",
                       model_job=config.job, protocol=config.protocol, active=config.active,
                       passives=list(config.passives),
                       datasets=_datasets(config, args.dataset),
                       max_rows=args.round_rows, timeout=args.timeout)
    _access_log(args.access_log)
    metrics = ScoringMetrics(plan.job)
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    coordinator = broker_coordinator(config, plan.job, plan.timeout)
    link = ScoringLink(plan, coordinator, max_in_flight=args.in_flight,
                       observe=metrics.observe_round, on_death=stop.link_stopped)
    # the HTTP thread and the link's thread hand requests and scores to each other: at
    # Python's default a thread waits up to 5 ms for the other to give up the GIL
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        try:
            link.open()
        except (PartyError, TransportError) as exc:
            link.close_session()  # at the parties that did open it
            if isinstance(exc, StepTimeout):
                raise ConfigError(f"cannot open the scoring session: {exc}") from None
            raise
        if not stop.requested:
            link.start()
            _serve(args, config, link, metrics, policy, hosts, limits, tls, stop, listening)
    finally:
        listening.close()
        if link.alive():
            link.stop()  # fails what is queued, closes the session at every party
        elif stop.requested or stop.link_died:
            link.close_session()
        try:
            link.transport.delete_inbox()
            link.transport.close()
        except Exception as exc:  # noqa: BLE001 - the broker connection the link lost
            if not stop.link_died:
                raise
            logging.getLogger("fedboost.serving").warning("could not delete the reply queue: "
                                                          "%r", exc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop.link_died:
        print(f"fedboost: error: the scoring link stopped ({link.problem}): exiting for a "
              f"supervisor to restart the service", file=sys.stderr, flush=True)
        return EXIT_SERVICE_FAILED
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """The service's listening socket, bound before the scoring session opens: a port in use
    fails the start in one line, before any party opens a session (uvicorn binding it after
    the session, a CI run's port taken meanwhile left the service announced but not
    listening, until a SIGTERM)."""
    from flows.config import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and an
    # accepted socket inherits 0 from socket.socket()'s default; without it Nagle held each
    # response's last segment for the client's delayed ACK (40 ms a request on Linux)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _serve(args: argparse.Namespace, config: Any, link: Any, metrics: Any, policy: Any,
           hosts: list[str], limits: Any, tls: Any, stop: _Stop,
           listening: socket.socket) -> None:
    """uvicorn until SIGTERM or Ctrl-C; it finishes the requests in flight before returning."""
    import uvicorn

    from fedboost.scoring_api import ModelInfo, make_app
    from fedboost.scoring_http import ACCEPT_BACKLOG, guarded_protocol
    from flows.declared import declaration

    info = ModelInfo(config.job, config.params.objective,
                     declaration(config.protocol).scored_as or "boosting")
    app = make_app(link, info, args.max_ids, policy=policy, allowed_hosts=hosts,
                   metrics=metrics, deadline=args.request_timeout)
    # TLS is the protocol's (the handshake of a connection counted from its accept), not
    # uvicorn's: uvicorn would hand the listening socket an SSL context, and asyncio a
    # connection to the protocol only after its handshake
    protocol = guarded_protocol(limits, lambda reason: metrics.dropped.labels(reason).inc(),
                                tls=tls)
    server = uvicorn.Server(uvicorn.Config(
        app, host=args.host, port=args.port, http=protocol, log_level="warning",
        access_log=False, lifespan="off", timeout_keep_alive=5, backlog=ACCEPT_BACKLOG,
        timeout_graceful_shutdown=int(args.timeout) + 5))
    metrics.connections.set_function(lambda: len(server.server_state.connections))
    stop.server = server
    if stop.requested or stop.link_died:
        return
    scheme = "https" if args.tls_cert else "http"
    print(f"serving {config.job} at {scheme}://{args.host}:{args.port}/v1/score (session "
          f"{link.plan.job}; parties {', '.join(link.plan.parties)})", flush=True)
    # uvicorn handles SIGTERM and SIGINT itself while it runs (stop accepting, finish the
    # requests in flight), then raises the signal again, which ``stop`` notes
    server.run(sockets=[listening])


def tls_context(args: argparse.Namespace) -> Any:
    """The server's TLS context from the flags (None: plain HTTP)."""
    import ssl

    from flows.config import ConfigError

    if args.tls_cert is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = (ssl.TLSVersion.TLSv1_3 if args.tls_min_version == "1.3"
                               else ssl.TLSVersion.TLSv1_2)
    try:
        context.load_cert_chain(args.tls_cert, args.tls_key)
        if args.tls_ciphers:
            context.set_ciphers(args.tls_ciphers)
        if args.tls_client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(args.tls_client_ca)
        if args.tls_crl is not None:
            context.load_verify_locations(args.tls_crl)
            context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    except ssl.SSLError as exc:
        raise ConfigError(f"TLS: {exc.reason or exc} (--tls-cert, --tls-key, --tls-ciphers, "
                          f"--tls-client-ca, --tls-crl)") from None
    return context


def _guards(args: argparse.Namespace) -> tuple[Any, list[str], Any]:
    """The gate's policy, the Host allowlist and the connection limits, from the flags."""
    from fedboost.api_keys import KeyRing, KeysFileError
    from fedboost.scoring_api import MAX_ID_CHARS
    from fedboost.scoring_guard import GatePolicy
    from fedboost.scoring_http import ConnectionLimits, descriptors_for
    from flows.config import ConfigError

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise ConfigError("--tls-client-ca needs HTTPS: give --tls-cert and --tls-key")
    if args.tls_crl is not None and args.tls_client_ca is None:
        raise ConfigError("--tls-crl revokes client certificates: give --tls-client-ca")
    for path in (args.tls_cert, args.tls_key, args.tls_client_ca, args.tls_crl):
        if path is not None and not path.is_file():
            raise ConfigError(f"{path}: no such file")
    authenticated = args.api_keys is not None or args.tls_client_ca is not None
    if not authenticated and not args.insecure_no_auth:
        raise ConfigError("serve-model needs authentication: --api-keys FILE (keys made with "
                          "'fedboost serve-model-keys') and/or --tls-client-ca PEM (with "
                          "--tls-cert/--tls-key); or --insecure-no-auth to serve scores to "
                          "anyone who can reach the port")
    if authenticated and args.insecure_no_auth:
        raise ConfigError("--insecure-no-auth contradicts --api-keys/--tls-client-ca")
    if args.insecure_no_auth:
        print(f"fedboost: warning: serving without authentication (--insecure-no-auth): "
              f"anyone who can reach {args.host}:{args.port}, any local user included, gets "
              f"scores", file=sys.stderr, flush=True)
    keys = None
    if args.api_keys is not None:
        try:
            keys = KeyRing(args.api_keys)
        except (OSError, KeysFileError) as exc:
            raise ConfigError(f"--api-keys: {exc}") from None
        if keys.in_use == 0:
            print(f"fedboost: warning: {args.api_keys} has no key in use: every request is "
                  f"refused until one is added", file=sys.stderr, flush=True)
        if args.tls_cert is None and args.host not in LOOPBACK:
            print("fedboost: warning: API keys over plain HTTP beyond loopback: anyone on the "
                  "path reads them (give --tls-cert/--tls-key)", file=sys.stderr, flush=True)
    hosts = args.allowed_host or ([] if args.host in WILDCARDS else [args.host, "localhost"])
    if not hosts:
        raise ConfigError(f"--host {args.host or '(any)'} listens on every address: name the "
                          f"Host values clients use with --allowed-host")
    max_body = args.max_body_bytes or 1024 + args.max_ids * (MAX_ID_CHARS + 8)
    if (min(args.max_connections, max_body, args.rate, args.header_timeout,
            args.body_timeout, args.tls_handshake_timeout) <= 0):
        raise ConfigError("--max-connections, --max-body-bytes, --rate and the timeouts must "
                          "be positive")
    connections = descriptors_for(args.max_connections)
    if connections < args.max_connections:
        print(f"fedboost: warning: --max-connections {args.max_connections} lowered to "
              f"{connections}: this process may open no more files (ulimit -n)",
              file=sys.stderr, flush=True)
    policy = GatePolicy(keys=keys, certificates=args.tls_client_ca is not None,
                        rate=args.rate, max_body_bytes=max_body)
    limits = ConnectionLimits(connections, args.header_timeout, args.body_timeout,
                              max_header_bytes=16 * 1024,
                              handshake_seconds=args.tls_handshake_timeout)
    return policy, hosts, limits


def _access_log(where: str) -> None:
    log = logging.getLogger("fedboost.serving.access")
    log.propagate = False
    if where == "off":
        log.setLevel(logging.WARNING)
        return
    handler = (logging.StreamHandler(sys.stderr) if where == "-"
               else logging.FileHandler(where, encoding="utf-8"))
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def _job_of(model_dir: Path) -> Any:
    from flows.config import ConfigError, validate_job
    from flows.declared import declaration

    job_file = RunFolder(model_dir).job
    try:
        raw = json.loads(job_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{job_file}: not a fedboost run folder ({exc})") from None
    config = validate_job(raw, str(job_file))
    if declaration(config.protocol).scored_as is None:
        raise ConfigError(f"{job_file}: a {config.protocol} model is every member's own: score "
                          f"it with 'fedboost predict' (the scoring service is for vertical "
                          f"models)")
    if config.transport.kind != "rabbitmq":
        raise ConfigError(f"{job_file}: transport {config.transport.kind!r}: the scoring "
                          f"service reaches the parties' running workers over rabbitmq")
    return config


def _datasets(config: Any, given: list[str]) -> dict[str, str]:
    from flows.config import ConfigError

    datasets = {name: party.dataset or "" for name, party in config.parties.items()}
    for item in given:
        party, sep, name = item.partition("=")
        if not sep or party not in datasets or not name:
            raise ConfigError(f"--dataset {item!r}: expected PARTY=NAME with PARTY one of "
                              f"{', '.join(datasets)}")
        datasets[party] = name
    return datasets
