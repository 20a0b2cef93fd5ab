#!/usr/bin/env python3
"""A fedboost container's health check (docker-compose.yml), one of:

  healthcheck url URL              the URL answers (the Prefect server's /api/health)
  healthcheck fresh FILE SECONDS   FILE was touched within SECONDS (a worker's --health-file)
  healthcheck live URL [CA [CERT KEY]]
                                   the scoring service's /livez answers "ok": over HTTPS
                                   trusting CA (a PEM), presenting the client certificate
                                   CERT with its KEY where the service asks for one
                                   (--tls-client-ca); no API key is needed

Exit 0 when healthy. The arguments hold no spaces: podman 4's Docker-compatible API joins a
health check's words with spaces and splits them again."""

import os
import ssl
import sys
import time
import urllib.request


def live(url: str, ca: str | None, cert: str | None, key: str | None) -> int:
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context(cafile=ca)
        if cert is not None:
            context.load_cert_chain(cert, key)
    # the probe asks 127.0.0.1 or a container's name, not a --allowed-host: /livez checks none
    with urllib.request.urlopen(url, timeout=5, context=context) as reply:
        return 0 if reply.status == 200 and reply.read(16) == b"ok" else 1


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "url":
        with urllib.request.urlopen(argv[1], timeout=5):
            return 0
    if len(argv) == 3 and argv[0] == "fresh":
        return 0 if time.time() - os.path.getmtime(argv[1]) <= float(argv[2]) else 1
    if argv[:1] == ["live"] and len(argv) in (2, 3, 5):
        return live(argv[1], *(argv[2:] + [None] * (5 - len(argv))))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ssl.SSLError) as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
