#!/usr/bin/env bash
# Two organisations, each from its own start kit and its own compose project (issue 38, item
# 7), for real (make compose-orgs-test): 'fedboost provision init' at each, the outboxes
# exchanged, 'provision finish'; the lender 'bank' (party guest) runs its broker, its worker,
# PostgreSQL, the Prefect server on it and the runner; the data provider 'telco' (party host)
# its broker and its worker. The brokers reach each other only through a network of their own
# (fedboost-orgs-between, standing in for the WAN: each broker's alias there is its
# organisation's address in the description), by their shovels over TLS. Then: every container
# healthy; every shovel running; a training run started at the lender reaches the data
# provider through the brokers alone and completes; its flow run is in PostgreSQL; each
# party's model is in its own volume; no container's inspect shows a password; tear down.
# One line per step with its seconds; the first failure stops it (exit 1).
#
# Engine and stand-in images as deploy/compose-smoke.sh (deploy/smoke-lib.sh). Needs fedboost
# on PATH (pip install .) and ../shared/data beside the checkout.
set -euo pipefail

cd "$(dirname "$0")/.."
work=$(mktemp -d)
state=$work/state
: > "$state"
podman_pid="" health_pid="" compose="" engine=""
started=$EPOCHREALTIME
. deploy/smoke-lib.sh
python=$(head -1 "$(command -v fedboost)" | sed 's/^#!//')  # the fedboost command's Python
data=${FEDBOOST_DATA_DIR:-../shared/data}
between=fedboost-orgs-between
orgs=(bank telco)
declare -A party=([bank]=guest [telco]=host) dataset=([bank]=guest [telco]=host)
trees=${SMOKE_TREES:-3}

project() { echo "fedboost-orgs-$1"; }
# org_compose ORG COMPOSE-ARGS...: compose in ORG's kit, with the stand-in WAN's override
org_compose() {
  local org=$1
  shift
  (cd "$work/kits/$org/compose" && \
    $compose -p "$(project "$org")" -f compose.yml -f "$work/between-$org.yml" "$@")
}
health_labels() { for org in "${orgs[@]}"; do echo "com.docker.compose.project=$(project "$org")"; done; }
step_failed() {
  [ -n "$compose" ] || return 0
  for org in "${orgs[@]}"; do
    [ -e "$work/between-$org.yml" ] || continue
    echo "     $org's services, last log lines:"
    org_compose "$org" logs --no-color --tail 20 2>&1 | sed 's/^/     | /'
  done
}

teardown() {
  local code=$? begin=$EPOCHREALTIME left=""
  set +e
  if [ -n "$health_pid" ]; then kill "$health_pid" 2>/dev/null; wait "$health_pid" 2>/dev/null; fi
  if [ -n "$compose" ]; then
    for org in "${orgs[@]}"; do
      [ -e "$work/between-$org.yml" ] && org_compose "$org" down --volumes --timeout 30 > /dev/null 2>&1
    done
    $engine network rm "$between" > /dev/null 2>&1
    for org in "${orgs[@]}"; do
      left+=$(for kind in container volume; do
        $engine $kind ls -q --filter "label=com.docker.compose.project=$(project "$org")"
      done | xargs)
    done
  fi
  if [ -n "$podman_pid" ]; then kill "$podman_pid" 2>/dev/null; wait "$podman_pid" 2>/dev/null; fi
  printf '%s   %6s s  %s\n' "$([ -z "$left" ] && echo ok || echo FAIL)" "$(since "$begin")" \
    "tear down: both projects' containers and volumes, the network, the kits removed"
  if [ -n "$left" ]; then echo "     | left behind: $left"; code=1; fi
  rm -rf "$work"
  say "done (exit $code)"
  exit "$code"
}
trap teardown EXIT
trap 'exit 130' INT TERM

build() {
  if [ "$engine" = docker ]; then DOCKER_BUILDKIT=0 docker build -q -t fedboost:latest . ; else
    podman build -q -t fedboost:latest . ; fi
  note "fedboost:latest built"
}

kits() {  # docs/operations.md, "Provisioning each organisation's start kit", at both
  mkdir -p "$work/kits"
  cat > "$work/federation.yaml" <<EOF
federation: credit
lender: bank
organisations:
  bank: {address: broker.bank.test, parties: [guest]}
  telco: {address: broker.telco.test, parties: [host]}
EOF
  for org in "${orgs[@]}"; do
    fedboost provision init "$work/federation.yaml" --org "$org" --out "$work/kits/$org"
  done
  fedboost provision finish "$work/federation.yaml" --org bank --kit "$work/kits/bank" \
    --from "telco=$work/kits/telco/outbox/bank"
  fedboost provision finish "$work/federation.yaml" --org telco --kit "$work/kits/telco" \
    --from "bank=$work/kits/bank/outbox/telco"
  for org in "${orgs[@]}"; do  # each party's data set, and its worker file pointing at it
    local p=${party[$org]}
    cp "$data/default_credit_hetero_${dataset[$org]}.csv" "$work/kits/$org/data/$p.csv"
    "$python" - "$work/kits/$org/workers/$p.yaml" "$p" <<'EOF'
import sys, yaml
from pathlib import Path
path, party = Path(sys.argv[1]), sys.argv[2]
config = yaml.safe_load(path.read_text())
config["data"] = f"/data/{party}.csv"
if party == "guest":
    config["label"] = "y"
path.write_text(yaml.safe_dump(config, sort_keys=False))
EOF
    # the stand-in WAN: the broker on a network of the two brokers alone, its organisation's
    # address as its name there
    cat > "$work/between-$org.yml" <<EOF
services:
  broker:
    networks:
      default: {}
      between: {aliases: [broker.$org.test]}
networks:
  between: {external: true, name: $between}
EOF
  done
  "$python" - "$work/kits/bank/jobs/job.yaml" "$trees" <<'EOF'
import sys, yaml
from pathlib import Path
path = Path(sys.argv[1])
job = yaml.safe_load(path.read_text())
job["params"]["n_trees"] = int(sys.argv[2])
path.write_text(yaml.safe_dump(job, sort_keys=False))
EOF
  keep FEDBOOST_PREFECT_PORT "$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  note "two kits (bank: lender, guest; telco: host), $(find "$work/kits" -name '*.key' | wc -l)" \
    "private keys, none in an outbox"
}

up() {
  $engine network create "$between" > /dev/null
  FEDBOOST_LINK_PORT=0 org_compose bank up -d
  FEDBOOST_LINK_PORT=0 org_compose telco up -d
}

all_healthy() {
  local ids=""
  for org in "${orgs[@]}"; do ids+=" $(org_compose "$org" ps -q)"; done
  wait_healthy "$1" $ids
}

shovels_running() {  # each broker's shovels to the other one, over TLS through the network
  local deadline=$((SECONDS + 120)) org status
  for org in "${orgs[@]}"; do
    while :; do
      status=$(org_compose "$org" exec -T broker rabbitmqctl -q shovel_status)
      if [ -n "$status" ] && ! grep -v running <<< "$status" | grep -q fedboost-to; then break; fi
      if [ $SECONDS -gt "$deadline" ]; then echo "$org: $status"; return 1; fi
      sleep 2
    done
    echo "$org: $(grep -c running <<< "$status") shovels running"
  done
  note "every shovel running (both brokers)"
}

train() {  # at the lender: the flow on its own broker, its run on the Prefect server
  org_compose bank exec -T -u fedboost runner fedboost train /jobs/job.yaml --out /tmp/run
  local auc
  auc=$(org_compose bank exec -T runner python -c "
import json; m = json.load(open('/tmp/run/metrics.json'))
assert m['n_trees'] == $trees, m['n_trees']; print(round(m['train_auc'], 4))")
  local runs
  runs=$(org_compose bank exec -T postgres psql -U prefect -d prefect -tAc \
    "select count(*) from flow_run where state_type = 'COMPLETED'")
  [ "$runs" -ge 1 ]
  local deployments
  deployments=$(org_compose bank exec -T postgres psql -U prefect -d prefect -tAc \
    "select count(*) from deployment")
  [ "$deployments" -ge 1 ]
  for org in "${orgs[@]}"; do
    org_compose "$org" exec -T "worker-${party[$org]}" ls "/models/credit/${party[$org]}" > /dev/null
  done
  note "$trees trees (train AUC $auc); $runs completed flow run(s) and $deployments deployment(s) in PostgreSQL;" \
    "each party's model in its own volume"
}

no_password_in_inspect() {
  local found="" org container
  for org in "${orgs[@]}"; do
    for container in $(org_compose "$org" ps -q); do
      $engine inspect "$container" > "$work/inspect.json"
      for secret in "$work/kits/$org"/passwords/*; do
        grep -qF "$(head -1 "$secret" | sed 's/^admin://')" "$work/inspect.json" &&
          found+=" $(basename "$secret")@$container"
      done
    done
  done
  [ -z "$found" ] || { echo "passwords in inspect:$found"; return 1; }
  note "no password in any container's inspect"
}

main() {
  say "per-organisation compose smoke test of $(git rev-parse --short HEAD 2>/dev/null || echo this tree)"
  step "engine and compose" engine_and_compose
  step "base images" base_images docker.io/library/python:3.11-slim \
    docker.io/library/rabbitmq:3.13 docker.io/library/postgres:16
  step "image fedboost:latest" build
  step "start kits (provision init, outboxes exchanged, finish)" kits
  step "both organisations up (compose project each)" up
  step "every container healthy" all_healthy 600
  step "shovels between the brokers" shovels_running
  step "training run at the lender ($trees trees) across the brokers" train
  step "inspect of every container: no password" no_password_in_inspect
}

main "$@"
