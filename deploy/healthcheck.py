#!/usr/bin/env python3
"""A fedboost container's health check (docker-compose.yml), one of:

  healthcheck url URL              the URL answers (the Prefect server's /api/health)
  healthcheck fresh FILE SECONDS   FILE was touched within SECONDS (a worker's --health-file)

Exit 0 when healthy. The arguments hold no spaces: podman 4's Docker-compatible API joins a
health check's words with spaces and splits them again."""

import os
import sys
import time
import urllib.request


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "url":
        with urllib.request.urlopen(argv[1], timeout=5):
            return 0
    if len(argv) == 3 and argv[0] == "fresh":
        return 0 if time.time() - os.path.getmtime(argv[1]) <= float(argv[2]) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
