#!/bin/sh
# Stand-ins for the two base images docker-compose.yml starts from, python:3.11-slim and
# rabbitmq:3.13, built from Debian bookworm's packages: for a machine that runs containers but
# reaches no image registry (only Debian's archive). They are not the official images; they
# behave like them where fedboost relies on it:
#   python:3.11-slim  Python 3.11 with pip and python in /usr/local/bin (a venv at /usr/local,
#                     since Debian's own pip refuses installs, PEP 668)
#   rabbitmq:3.13     Debian's rabbitmq-server (3.10), started by docker-entrypoint.sh as root
#                     that then runs the broker as the user 'rabbitmq' (uid 999), logs to the
#                     console, reads /etc/rabbitmq/rabbitmq.conf and conf.d/ like the official one,
#                     stops cleanly on SIGTERM
#   postgres:16       Debian's postgresql (15), an entry point that, like the official one,
#                     makes the cluster on first start from POSTGRES_USER, POSTGRES_DB and
#                     POSTGRES_PASSWORD_FILE (read as root) and runs the server as postgres
#                     (the per-organisation compose files of 'fedboost provision')
#
# usage: deploy/stand-in-images.sh [ENGINE]     ENGINE: podman (default) or docker
# Needs mmdebstrap (apt-get install mmdebstrap). Each image takes a minute or two; an image
# already present is kept (remove it to build it again), unless an older recipe of this script
# made it.
set -eu

engine=${1:-podman}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

have() { "$engine" image inspect "$1" >/dev/null 2>&1; }

# current IMAGE RECIPE [FILE]: present, and not made by an older recipe of this script (its
# label fedboost.stand-in below RECIPE; unlabelled, the image holds FILE, a file of Debian's
# package that an official image lacks); an official image is kept
current() {
  have "$1" || return 1
  made=$("$engine" image inspect -f '{{index .Config.Labels "fedboost.stand-in"}}' "$1" 2>/dev/null)
  case $made in
    ''|'<no value>')
      [ -n "${3:-}" ] && "$engine" run --rm --entrypoint test "$1" -e "$3" || return 0
      made=1 ;;
  esac
  [ "$made" -ge "$2" ] 2>/dev/null && return 0
  echo "stand-in $1: made by an older recipe ($made < $2), built again"
  "$engine" rmi "$1" >/dev/null
  return 1
}

# rootfs NAME PACKAGES [HOOK]: a minimal bookworm imported as the image NAME
rootfs() {
  mmdebstrap --quiet --variant=minbase --include="$2" ${3:+--essential-hook="$3"} \
    --customize-hook='chroot "$1" apt-get clean' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/*' \
    bookworm "$work/rootfs.tar"
  "$engine" import "$work/rootfs.tar" "$1" >/dev/null
  rm -f "$work/rootfs.tar"
}

python=docker.io/library/python:3.11-slim
if have "$python"; then
  echo "stand-in $python: present"
else
  rootfs localhost/fedboost-stand-in-python-rootfs python3,python3-venv,ca-certificates
  # pip in the image trusts what this machine's pip trusts (a proxy's CA, where one intercepts)
  cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$work/host-ca.crt"
  cat > "$work/python.Containerfile" <<'EOF'
FROM localhost/fedboost-stand-in-python-rootfs
COPY host-ca.crt /etc/ssl/certs/host-ca.crt
RUN python3 -m venv /usr/local && /usr/local/bin/pip --version \
    && printf '[global]\ncert = /etc/ssl/certs/host-ca.crt\n' > /etc/pip.conf
ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["python3"]
EOF
  "$engine" build -q -t "$python" -f "$work/python.Containerfile" "$work" >/dev/null
  "$engine" rmi localhost/fedboost-stand-in-python-rootfs >/dev/null
  echo "stand-in $python: built from Debian's python3" \
       "($("$engine" run --rm "$python" python --version))"
fi

rabbitmq=docker.io/library/rabbitmq:3.13
if current "$rabbitmq" 2 /usr/lib/rabbitmq/bin/rabbitmq-script-wrapper; then
  echo "stand-in $rabbitmq: present"
else
  # the official image's user: uid and gid 999, made before the package would pick others
  rootfs localhost/fedboost-stand-in-rabbitmq-rootfs rabbitmq-server,ca-certificates \
    'echo rabbitmq:x:999: >> "$1/etc/group"; echo rabbitmq:!:: >> "$1/etc/gshadow";
     echo rabbitmq:x:999:999::/var/lib/rabbitmq:/usr/sbin/nologin >> "$1/etc/passwd";
     echo rabbitmq:!:19000:::::: >> "$1/etc/shadow"'
  cat > "$work/docker-entrypoint.sh" <<'EOF'
#!/bin/sh
# as the official image's: started as root, it hands the data folder to 'rabbitmq' and
# runs the broker as that user
set -e
if [ "$(id -u)" = 0 ]; then
  mkdir -p /var/lib/rabbitmq && chown -R rabbitmq:rabbitmq /var/lib/rabbitmq
  exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups "$0" "$@"
fi
# Debian's /usr/sbin/rabbitmq-server is a wrapper that neither passes SIGTERM on (as PID 1 it
# ignored 'docker stop' until the SIGKILL) nor logs to the console; the script behind it does
# both: it stops the broker cleanly on SIGTERM, as the official image's does
if [ "$1" = rabbitmq-server ]; then
  shift
  set -- /usr/lib/rabbitmq/bin/rabbitmq-server "$@"
fi
exec "$@"
EOF
  # the official image's conf.d/10-defaults.conf
  printf '%s\n' 'loopback_users.guest = false' 'log.console = true' > "$work/10-defaults.conf"
  cat > "$work/rabbitmq.Containerfile" <<'EOF'
FROM localhost/fedboost-stand-in-rabbitmq-rootfs
COPY docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
COPY 10-defaults.conf /etc/rabbitmq/conf.d/10-defaults.conf
RUN chmod 755 /usr/local/bin/docker-entrypoint.sh && rm -f /etc/rabbitmq/rabbitmq-env.conf \
    && chown -R rabbitmq:rabbitmq /var/lib/rabbitmq /etc/rabbitmq
ENV HOME=/var/lib/rabbitmq LANG=C.UTF-8 RABBITMQ_LOGS=-
LABEL fedboost.stand-in=2
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["rabbitmq-server"]
EOF
  "$engine" build -q -t "$rabbitmq" -f "$work/rabbitmq.Containerfile" "$work" >/dev/null
  "$engine" rmi localhost/fedboost-stand-in-rabbitmq-rootfs >/dev/null
  echo "stand-in $rabbitmq: built from Debian's rabbitmq-server" \
       "($("$engine" run --rm --entrypoint dpkg-query "$rabbitmq" \
            -W -f '${Version}' rabbitmq-server))"
fi

postgres=docker.io/library/postgres:16
if current "$postgres" 3; then
  echo "stand-in $postgres: present"
else
  rootfs localhost/fedboost-stand-in-postgres-rootfs postgresql,ca-certificates
  cat > "$work/postgres-entrypoint.sh" <<'EOF'
#!/bin/sh
# The stand-in's entry point: the official image's contract for what fedboost uses of it.
set -eu
data=/var/lib/postgresql/data
bin=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$data" /run/postgresql && chown postgres:postgres "$data" /run/postgresql
  chmod 700 "$data"
  # the password file is the operator's (mode 0600): read here, as root
  if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    POSTGRES_PASSWORD=$(head -n 1 "$POSTGRES_PASSWORD_FILE"); export POSTGRES_PASSWORD
  fi
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$data/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE is needed}"
  user=${POSTGRES_USER:-postgres}
  pwfile=$(mktemp); printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  "$bin/initdb" -D "$data" -U "$user" --pwfile="$pwfile" --auth-local=trust \
      --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$data/pg_hba.conf"
  db=${POSTGRES_DB:-$user}  # as the official image: POSTGRES_DB, else the user's name
  if [ "$db" != postgres ]; then
    echo "CREATE DATABASE \"$db\" OWNER \"$user\";" \
      | "$bin/postgres" --single -D "$data" -j postgres >/dev/null
  fi
fi
unset POSTGRES_PASSWORD
if [ "$1" = postgres ]; then
  shift
  set -- "$bin/postgres" -D "$data" -c listen_addresses='*' "$@"
fi
exec "$@"
EOF
  cat > "$work/postgres.Containerfile" <<'EOF'
FROM localhost/fedboost-stand-in-postgres-rootfs
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
RUN chmod 755 /usr/local/bin/docker-entrypoint.sh && rm -rf /var/lib/postgresql/*/main \
    && for tool in pg_isready psql; do \
         ln -s "$(ls -d /usr/lib/postgresql/*/bin | tail -1)/$tool" "/usr/local/bin/$tool"; done
ENV LANG=C.UTF-8 PATH=/usr/local/bin:/usr/bin:/bin
LABEL fedboost.stand-in=3
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
EOF
  "$engine" build -q -t "$postgres" -f "$work/postgres.Containerfile" "$work" >/dev/null
  "$engine" rmi localhost/fedboost-stand-in-postgres-rootfs >/dev/null
  echo "stand-in $postgres: built from Debian's postgresql" \
       "($("$engine" run --rm --entrypoint dpkg-query "$postgres" -W -f '${Version}' postgresql))"
fi
