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
export HOME=/home/fedboost USER=fedboost LOGNAME=fedboost
exec setpriv --reuid=fedboost --regid=fedboost --init-groups --no-new-privs "$@"
