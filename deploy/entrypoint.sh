#!/bin/sh
# The fedboost image's entry point. Its command is a program (prefect, python) or else a fedboost
# subcommand: 'worker --party host ...' runs 'fedboost worker --party host ...'.
#
# Started as root (docker-compose.yml does so for each service that holds a private key), it
# copies every file mounted under /secrets to the same path without the prefix
# (/secrets/keys/host.key -> /keys/host.key), owned by the user fedboost and readable by it
# alone, then runs the command as fedboost. So the keys stay the operator's files, mode 0600 on
# the host, and no set-up step has to give them to the container's uid (which rootless engines
# map to yet another uid). Started as any other user, it runs the command as that user.
# The copies land on tmpfs mounts (/keys, /tls, /passwords: docker-compose.yml keeps the root
# read-only), so no key or password outlives the container.
#
# Passwords come as such files too, never as environment variables (which 'docker inspect'
# shows): FEDBOOST_AMQP_PASSWORD_FILE is read by fedboost itself; FEDBOOST_PREFECT_AUTH_FILE
# (Prefect's user:password) is written here into the Prefect profile PREFECT_PROFILES_PATH
# (on the tmpfs home, 0600), which every prefect command of the container's user reads, the
# ones started by 'docker compose exec -u fedboost' included; so is the database password of
# FEDBOOST_PREFECT_DATABASE_PASSWORD_FILE (a Prefect server on PostgreSQL, whose host, user and
# database name are PREFECT_SERVER_DATABASE_* variables: no secret among them).
set -eu

[ $# -gt 0 ] || set -- --help
command -v "$1" >/dev/null 2>&1 || set -- fedboost "$@"
if [ "$(id -u)" != 0 ]; then
  exec "$@"
fi
if [ -d /secrets ]; then
  find /secrets -type f | while read -r secret; do
    install -D -o fedboost -g fedboost -m 0400 "$secret" "${secret#/secrets}"
  done
fi
if [ -n "${FEDBOOST_PREFECT_AUTH_FILE:-}" ]; then
  : "${PREFECT_PROFILES_PATH:?FEDBOOST_PREFECT_AUTH_FILE needs PREFECT_PROFILES_PATH}"
  install -d -o fedboost -g fedboost -m 0700 "$(dirname "$PREFECT_PROFILES_PATH")"
  (umask 077; python - "$FEDBOOST_PREFECT_AUTH_FILE" "$PREFECT_PROFILES_PATH" \
      ${FEDBOOST_PREFECT_DATABASE_PASSWORD_FILE:+"$FEDBOOST_PREFECT_DATABASE_PASSWORD_FILE"} <<'PY'
import json, sys
from pathlib import Path
auth = next(iter(Path(sys.argv[1]).read_text().splitlines()), "")
if ":" not in auth:
    sys.exit(f"fedboost-entrypoint: {sys.argv[1]}: expected user:password on its first line")
value = json.dumps(auth)  # a TOML basic string
profile = (f'active = "fedboost"\n[profiles.fedboost]\n'
           f'PREFECT_API_AUTH_STRING = {value}\n'
           f'PREFECT_SERVER_API_AUTH_STRING = {value}\n')
if len(sys.argv) > 3:  # the Prefect server's database password (PostgreSQL)
    db = next(iter(Path(sys.argv[3]).read_text().splitlines()), "")
    if not db:
        sys.exit(f"fedboost-entrypoint: {sys.argv[3]}: empty (the database password)")
    profile += f'PREFECT_SERVER_DATABASE_PASSWORD = {json.dumps(db)}\n'
Path(sys.argv[2]).write_text(profile)
PY
  )
  chown fedboost:fedboost "$PREFECT_PROFILES_PATH"
fi
export HOME=/home/fedboost USER=fedboost LOGNAME=fedboost
exec setpriv --reuid=fedboost --regid=fedboost --init-groups --no-new-privs "$@"
