#!/usr/bin/env bash
# Organisations as hosts of their own: one Linux network namespace per organisation on a bridge
# of this script's own, each with its own address, loopback and (optionally) its own RabbitMQ node.
#
#   deploy/netns-federation.sh up [--orgs guest,host] [--machines host-2] [--no-brokers]
#                                 [--rate RATE] [--bridge-address]
#                                 [--per-org [--lender ORG] [--parties ORG=P1+P2,...] [--kits DIR]]
#   deploy/netns-federation.sh down          # removes everything it made, also after a partial up
#   deploy/netns-federation.sh status        # what is up (no passwords)
#   deploy/netns-federation.sh shape NS RATE [BURST] # token-bucket limit on NS's link, both ways
#   deploy/netns-federation.sh shape NS off
#   deploy/netns-federation.sh cut NS        # NS's link down (its cable pulled); mend NS: up again
#   deploy/netns-federation.sh ctl ORG ARGS  # rabbitmqctl ARGS against ORG's broker
#   deploy/netns-federation.sh restart ORG   # ORG's broker node stopped and started again
#   deploy/netns-federation.sh env           # "name kind namespace address password" lines (root)
#   deploy/netns-federation.sh links         # per-org: "ORG {shovel status}" lines
#
# Runs as root. Every name it makes starts with $FEDBOOST_NETNS_PREFIX (default "fbn"): namespaces
# "fbn-<org>", host-side veths "fbnv<i>", the bridge "fbn-br". Addresses come from a private /24
# of its own ($FEDBOOST_NETNS_NET, default 10.231.0): organisation i at .(10+i), inside its own
# namespace only; the bridge gets .1 only with --bridge-address (so the root namespace, where a
# test or a flow runs, can reach the brokers; then the /24 must not be routed here already). "--orgs" are organisations with a broker each, "--machines" are further
# namespaces without one (e.g. a data provider's second machine). Each broker is node
# "fbn-<org>@localhost" listening on <address>:5672 only, with a user "<org>" whose random password
# is kept in the state folder ($FEDBOOST_NETNS_DIR, default /run/fedboost-netns; secrets/ root only).
# Erlang distribution stays on each namespace's own loopback (its own epmd).
# --per-org: one broker per organisation joined by shovels (docs/operations.md, "Across
# organisations"): each organisation's parties are --parties' (default: one named after it), the lender (default: the first
# organisation) runs the flows; messages.broker_links writes each broker's link users, queues,
# exchanges and shovels, deploy/make-certs.sh its TLS files (one test CA), and each broker also
# listens with TLS on <address>:5671 for the other brokers' shovels. $FEDBOOST_PYTHON (default
# python3) runs the generator. --kits DIR: the brokers' files come from start kits that
# 'fedboost provision' made instead (DIR/<org>/broker/: definitions.json, tls.conf, tls/), from a
# description whose tls_dir is $FEDBOOST_NETNS_DIR/tls and whose addresses are the namespaces'.
set -euo pipefail

PREFIX=${FEDBOOST_NETNS_PREFIX:-fbn}
NET=${FEDBOOST_NETNS_NET:-10.231.0}
STATE=${FEDBOOST_NETNS_DIR:-/run/fedboost-netns}
BRIDGE="${PREFIX}-br"
AMQP_PORT=5672
TLS_PORT=5671
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${FEDBOOST_PYTHON:-$( [ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3)}
BROKER_WAIT=${FEDBOOST_NETNS_BROKER_WAIT:-90}

die() { echo "netns-federation: $*" >&2; exit 1; }
log() { echo "netns-federation: $*" >&2; }

need_root() {
    [ "$(id -u)" = 0 ] || die "must run as root (it makes network namespaces)"
}

valid_name() {  # organisation names: short, lower-case, usable in file and node names
    [[ "$1" =~ ^[a-z][a-z0-9_-]{0,19}$ ]] || die "bad organisation name '$1' (a-z, 0-9, _ or -)"
}

our_namespaces() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}-" || true
}

node_of() { echo "${PREFIX}-$1@localhost"; }

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

rabbit_env() {  # the environment of organisation $1's broker node
    local org=$1 dir="$STATE/brokers/$1"
    echo RABBITMQ_NODENAME="$(node_of "$org")" \
        RABBITMQ_CONFIG_FILE="$dir/rabbitmq" \
        RABBITMQ_MNESIA_BASE="$dir/mnesia" \
        RABBITMQ_LOG_BASE="$dir/log" \
        RABBITMQ_NODE_PORT="$AMQP_PORT" \
        RABBITMQ_DIST_PORT=25672 \
        RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
        RABBITMQ_PID_FILE="$dir/pid" \
        RABBITMQ_FEATURE_FLAGS_FILE="$dir/feature_flags"
}

ctl() {  # rabbitmqctl against organisation $1's node, inside its namespace
    local org=$1; shift
    # shellcheck disable=SC2046
    in_ns "${PREFIX}-$org" env $(rabbit_env "$org") rabbitmqctl -q -n "$(node_of "$org")" "$@"
}

start_broker() {
    local org=$1 addr=$2 dir="$STATE/brokers/$1"
    mkdir -p "$dir/mnesia" "$dir/log"
    cat > "$dir/rabbitmq.conf" <<EOF
listeners.tcp.1 = $addr:$AMQP_PORT
# the default guest user is deleted, and an organisation may be called "guest"
loopback_users = none
log.file.level = warning
EOF
    if [ -e "$STATE/links/$org/tls.conf" ]; then
        cat "$STATE/links/$org/tls.conf" >> "$dir/rabbitmq.conf"
        echo "[rabbitmq_shovel]." > "$dir/enabled_plugins"
    else
        echo "[]." > "$dir/enabled_plugins"
    fi
    chown -R rabbitmq:rabbitmq "$dir"
    chmod 750 "$dir"
    log "starting broker $(node_of "$org") at $addr:$AMQP_PORT"
    # shellcheck disable=SC2046
    in_ns "${PREFIX}-$org" env $(rabbit_env "$org") rabbitmq-server -detached
}

await_broker() {
    local org=$1 addr=$2
    if ! timeout "$BROKER_WAIT" bash -c "$(declare -f in_ns node_of rabbit_env ctl); \
            PREFIX='$PREFIX' STATE='$STATE' AMQP_PORT='$AMQP_PORT'; \
            until ctl '$org' await_startup >/dev/null 2>&1; do sleep 1; done"; then
        tail -n 20 "$STATE/brokers/$org/log/"*.log >&2 2>/dev/null || true
        die "broker of $org did not start within ${BROKER_WAIT}s"
    fi
    local pass
    pass=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
    # the default guest user goes (it could only log in over the node's loopback anyway); the
    # password reaches rabbitmqctl on stdin, not on a command line that ps shows
    ctl "$org" delete_user guest >/dev/null 2>&1 || true
    echo "$pass" | ctl "$org" add_user "$org" >/dev/null
    ctl "$org" set_permissions -p / "$org" ".*" ".*" ".*" >/dev/null
    (umask 077; echo "$pass" > "$STATE/secrets/$org")
    if [ -e "$STATE/links/$org/definitions.json" ]; then
        # rabbitmqctl runs as the rabbitmq user; the file (link passwords, which the broker
        # keeps anyway) is root's: a copy the broker's user reads, gone after the import
        local copy="$STATE/brokers/$org/definitions.json"
        install -m 600 -o rabbitmq -g rabbitmq "$STATE/links/$org/definitions.json" "$copy"
        ctl "$org" import_definitions "$copy" >/dev/null
        rm -f "$copy"
        log "broker of $org: link users, queues and shovels imported"
    fi
    log "broker of $org up: amqp://$org:***@$addr:$AMQP_PORT/"
}

make_links() {  # --per-org: TLS files (one test CA) and every broker's definitions
    local lender=$1 parties=$2 ns addr n k org desc="$STATE/links/federation.json" first=1 mine
    mkdir -p "$STATE/links" "$STATE/tls/ca"
    chmod 700 "$STATE/links"; chmod 711 "$STATE/tls"; chmod 700 "$STATE/tls/ca"
    {
        printf '{"lender": "%s", "tls_port": %s, "tls_dir": "%s", "organisations": {' \
            "$lender" "$TLS_PORT" "$STATE/tls"
        while read -r ns addr n k org <&3; do
            [ "$k" = org ] || continue
            [ $first = 1 ] || printf ', '
            first=0
            mine=$org
            for spec in ${parties//,/ }; do [ "${spec%%=*}" = "$org" ] && mine=${spec#*=}; done
            [[ "$mine" =~ ^[A-Za-z0-9_+-]+$ ]] || die "bad parties '$mine' of $org"
            printf '"%s": {"address": "%s", "parties": ["%s"]}' "$org" "$addr" "${mine//+/\", \"}"
        done 3< "$STATE/hosts"
        printf '}}\n'
    } > "$desc"
    while read -r ns addr n k org <&3; do
        [ "$k" = org ] || continue
        local dir="$STATE/tls/$org"
        mkdir -p "$dir"
        # the CA signs every broker's certificates; only its own folder keeps its key
        if [ -e "$STATE/tls/ca/ca.key" ]; then cp -p "$STATE/tls/ca/ca.key" "$STATE/tls/ca/ca.pem" "$dir/"; fi
        sh "$REPO/deploy/make-certs.sh" -o "$dir" -s "broker.$org" link >/dev/null
        [ -e "$STATE/tls/ca/ca.key" ] || cp -p "$dir/ca.key" "$dir/ca.pem" "$STATE/tls/ca/"
        rm -f "$dir/ca.key"
        chown -R rabbitmq:rabbitmq "$dir"; chmod 700 "$dir"
    done 3< "$STATE/hosts"
    (cd "$REPO" && PYTHONPATH="$REPO" "$PYTHON" -m messages.broker_links "$desc" "$STATE/links") >/dev/null \
        || die "messages.broker_links could not write the brokers' definitions (is $lender one of --orgs?)"
}

use_kits() {  # --per-org --kits: each broker's files from its organisation's provisioned kit
    local kits=$1 ns addr n k org
    mkdir -p "$STATE/links" "$STATE/tls"
    chmod 700 "$STATE/links"; chmod 711 "$STATE/tls"
    while read -r ns addr n k org <&3; do
        [ "$k" = org ] || continue
        local kit="$kits/$org/broker"
        [ -e "$kit/definitions.json" ] || die "no $kit/definitions.json (run fedboost provision finish for $org)"
        mkdir -p "$STATE/links/$org"
        install -m 600 "$kit/definitions.json" "$kit/tls.conf" "$STATE/links/$org/"
        cp -r "$kit/tls" "$STATE/tls/$org"
        chown -R rabbitmq:rabbitmq "$STATE/tls/$org"; chmod 700 "$STATE/tls/$org"
    done 3< "$STATE/hosts"
}

host_veth() {  # the bridge-side end of namespace (or organisation) $1's link
    local ns=$1 i
    [[ $ns == "${PREFIX}-"* ]] || ns="${PREFIX}-$ns"
    i=$(awk -v ns="$ns" '$1 == ns {print $3}' "$STATE/hosts")
    [ -n "$i" ] || die "no namespace $ns (status lists them)"
    echo "${PREFIX}v$i"
}

shape() {  # token bucket on both ends of namespace $1's link: what leaves and what enters it
    local ns=$1 rate=$2 burst=${3:-32kbit} veth
    [[ $ns == "${PREFIX}-"* ]] || ns="${PREFIX}-$ns"
    veth=$(host_veth "$ns")
    for side in "host" "ns"; do
        local run=() dev=$veth
        if [ "$side" = ns ]; then run=(ip netns exec "$ns"); dev=eth0; fi
        "${run[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
        if [ "$rate" != off ]; then
            "${run[@]}" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 400ms
        fi
    done
    log "link of $ns: ${rate} (burst $burst)"
}

cmd_up() {
    need_root
    local orgs="guest,host" machines="" brokers=1 rate="" bridge_addr=0 per_org=0 lender="" parties="" kits=""
    while [ $# -gt 0 ]; do
        case $1 in
            --orgs) orgs=$2; shift 2 ;;
            --machines) machines=$2; shift 2 ;;
            --no-brokers) brokers=0; shift ;;
            --rate) rate=$2; shift 2 ;;
            --bridge-address) bridge_addr=1; shift ;;
            --per-org) per_org=1; shift ;;
            --lender) lender=$2; shift 2 ;;
            --parties) parties=$2; shift 2 ;;
            --kits) kits=$(cd "$2" && pwd) || die "no kits folder $2"; shift 2 ;;
            *) die "unknown option $1 (see the head of $0)" ;;
        esac
    done
    if [ -n "$(our_namespaces)" ] || ip link show "$BRIDGE" >/dev/null 2>&1 || [ -e "$STATE/hosts" ]; then
        die "already up (or left over): run '$0 down' first"
    fi
    ip netns add "${PREFIX}-probe$$" 2>/dev/null || die "cannot make network namespaces here (ip netns add failed)"
    ip netns del "${PREFIX}-probe$$"
    command -v rabbitmq-server >/dev/null || [ "$brokers" = 0 ] || die "rabbitmq-server not installed (or use --no-brokers)"

    # the brokers (user rabbitmq) must reach their folders; the passwords stay root's
    mkdir -p "$STATE/brokers" "$STATE/secrets"
    chmod 711 "$STATE" "$STATE/brokers"; chmod 700 "$STATE/secrets"
    : > "$STATE/hosts"  # from here on, down knows what to remove
    if [ "$bridge_addr" = 1 ] && ip -4 route show | grep -q "^$NET\.0/24 "; then
        rm -rf "$STATE"; die "$NET.0/24 is routed here already (another federation?): pick FEDBOOST_NETNS_NET"
    fi
    ip link add "$BRIDGE" type bridge
    if [ "$bridge_addr" = 1 ]; then ip addr add "$NET.1/24" dev "$BRIDGE"; fi
    ip link set "$BRIDGE" up

    local i=0 name kind list
    for kind in org machine; do
        if [ $kind = org ]; then list=$orgs; else list=$machines; fi
        for name in ${list//,/ }; do
            valid_name "$name"
            i=$((i + 1))
            [ $i -le 200 ] || die "too many namespaces"
            local ns="${PREFIX}-$name" addr="$NET.$((10 + i))"
            grep -qE "^$ns " "$STATE/hosts" && die "$name named twice"
            echo "$ns $addr $i $kind $name" >> "$STATE/hosts"
            ip netns add "$ns"
            ip link add "${PREFIX}v$i" type veth peer name "${PREFIX}p$i"
            ip link set "${PREFIX}p$i" netns "$ns"
            in_ns "$ns" ip link set "${PREFIX}p$i" name eth0
            in_ns "$ns" ip addr add "$addr/24" dev eth0
            in_ns "$ns" ip link set lo up
            in_ns "$ns" ip link set eth0 up
            ip link set "${PREFIX}v$i" master "$BRIDGE"
            ip link set "${PREFIX}v$i" up
            if [ -n "$rate" ]; then shape "$ns" "$rate"; fi
        done
    done
    [ $i -gt 0 ] || die "no organisations named"
    if [ "$per_org" = 1 ]; then
        [ "$brokers" = 1 ] || die "--per-org needs brokers"
        if [ -n "$kits" ]; then use_kits "$kits"; else make_links "${lender:-${orgs%%,*}}" "$parties"; fi
    fi
    if [ "$brokers" = 1 ]; then
        local ns addr n k org
        while read -r ns addr n k org <&3; do
            [ "$k" = org ] && start_broker "$org" "$addr"
        done 3< "$STATE/hosts"
        while read -r ns addr n k org <&3; do
            [ "$k" = org ] && await_broker "$org" "$addr"
        done 3< "$STATE/hosts"
    fi
    cmd_status
}

cmd_down() {
    need_root
    local ns org pid
    # brokers first (politely), then whatever else still runs inside our namespaces (epmd, workers)
    if [ -d "$STATE/brokers" ]; then
        for dir in "$STATE"/brokers/*/; do
            [ -d "$dir" ] || continue
            org=$(basename "$dir")
            if ip netns list | awk '{print $1}' | grep -qx "${PREFIX}-$org"; then
                timeout 30 bash -c "$(declare -f in_ns node_of rabbit_env ctl); \
                    PREFIX='$PREFIX' STATE='$STATE' AMQP_PORT='$AMQP_PORT'; ctl '$org' stop" \
                    >/dev/null 2>&1 || true
            fi
        done
    fi
    for ns in $(our_namespaces); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
    done
    local waited=0
    for ns in $(our_namespaces); do
        while [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && [ $waited -lt 10 ]; do sleep 1; waited=$((waited + 1)); done
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns del "$ns"
    done
    for link in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${PREFIX}v[0-9]+$" || true); do
        ip link del "$link" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$STATE"
    log "down: no namespace, link or broker of ours left"
}

cmd_status() {
    if [ ! -e "$STATE/hosts" ]; then
        echo "down"
        [ -z "$(our_namespaces)" ] || echo "left over namespaces: $(our_namespaces | tr '\n' ' ')"
        return 0
    fi
    local ns addr n kind name up
    while read -r ns addr n kind name <&3; do
        up="-"
        if [ "$kind" = org ] && [ -e "$STATE/secrets/$name" ]; then
            up="amqp://$name:***@$addr:$AMQP_PORT/ node $(node_of "$name")"
        fi
        local q
        q=$(in_ns "$ns" tc qdisc show dev eth0 2>/dev/null | grep -o 'tbf.*rate [^ ]*' | awk '{print $NF}' || true)
        echo "$name $kind namespace=$ns address=$addr link=${q:-unlimited} broker=$up"
    done 3< "$STATE/hosts"
}

cmd_env() {  # for the pytest fixture: one line per host, passwords included (root reads it anyway)
    need_root
    [ -e "$STATE/hosts" ] || die "not up"
    local ns addr n kind name pass
    while read -r ns addr n kind name <&3; do
        pass=""
        [ -e "$STATE/secrets/$name" ] && pass=$(cat "$STATE/secrets/$name")
        echo "$name $kind $ns $addr $pass"
    done 3< "$STATE/hosts"
}

cmd_restart() {  # the node stopped (its Erlang VM gone) and started again on its own data
    need_root
    local org=$1 ns addr n k name
    [ -e "$STATE/brokers/$org" ] || die "no broker of $org"
    ctl "$org" stop >/dev/null 2>&1 || true
    while read -r ns addr n k name <&3; do
        [ "$name" = "$org" ] && start_broker "$org" "$addr"
    done 3< "$STATE/hosts"
    timeout "$BROKER_WAIT" bash -c "$(declare -f in_ns node_of rabbit_env ctl); \
        PREFIX='$PREFIX' STATE='$STATE' AMQP_PORT='$AMQP_PORT'; \
        until ctl '$org' await_startup >/dev/null 2>&1; do sleep 1; done" \
        || die "broker of $org did not start again within ${BROKER_WAIT}s"
    log "broker of $org restarted"
}

cmd_links() {  # each broker's shovels: "ORG {json of its shovel_status}" (state running, ...)
    need_root
    [ -d "$STATE/links" ] || die "not up with --per-org"
    local dir org
    for dir in "$STATE"/brokers/*/; do
        org=$(basename "$dir")
        ctl "$org" shovel_status --formatter json 2>/dev/null | tr -d '\n' \
            | sed -e 's/^\[//' -e 's/\]$//' -e 's/},{/}\n{/g' | sed -n "s/^\(.\+\)$/$org \1/p" | awk 1 || true
    done
}

case ${1:-} in
    up) shift; cmd_up "$@" ;;
    links) cmd_links ;;
    restart) [ $# -eq 2 ] || die "usage: $0 restart ORG"; cmd_restart "$2" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    ctl) need_root; [ $# -ge 3 ] || die "usage: $0 ctl ORG ARGS..."; [ -e "$STATE/brokers/$2" ] || die "no broker of $2"
        org=$2; shift 2; ctl "$org" "$@" ;;
    cut|mend) need_root; [ $# -eq 2 ] || die "usage: $0 $1 NAMESPACE"; [ -e "$STATE/hosts" ] || die "not up"
        dev=$(host_veth "$2"); if [ "$1" = cut ]; then ip link set "$dev" down; else ip link set "$dev" up; fi
        log "link of $2: $1" ;;
    shape) need_root; [ $# -eq 3 ] || [ $# -eq 4 ] || die "usage: $0 shape NAMESPACE RATE|off [BURST]"; [ -e "$STATE/hosts" ] || die "not up"; shape "$2" "$3" "${4:-32kbit}" ;;
    *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
