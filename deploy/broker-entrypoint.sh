#!/bin/sh
# The broker's entry point (docker-compose.yml mounts it into the rabbitmq image). As root, it
# copies the broker's TLS key, mounted read-only as the operator's file (mode 0600), to where
# deploy/rabbitmq.conf names it, owned by the user rabbitmq and readable by it alone; then the
# image's own entry point runs the broker as that user. So no set-up step chowns the key.
set -eu
install -D -o rabbitmq -g rabbitmq -m 0400 /secrets/tls/server.key /etc/rabbitmq/tls/server.key
exec docker-entrypoint.sh "$@"
