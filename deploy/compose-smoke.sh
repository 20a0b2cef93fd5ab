#!/usr/bin/env bash
# docs/operations.md's "docker compose" section, for real, from a checkout beside
# shared/ (make compose-test): passwords, broker definitions, signing keys and TLS
# certificates; build; start with the profile 'horizontal'; wait for every health check; run
# the vertical and the horizontal deployment to completion with 'prefect deployment run' and
# check each party's model volume; serve the vertical model ('scoring') and revoke its API key
# on the host (refused in the container within seconds); crash a worker mid-run (restarted by its restart policy, the
# run resumes to the uninterrupted model); stop a worker by hand mid-run ('kill', which no
# restart policy covers: the run fails naming it, and once the worker is up again a retry
# resumes to the same model); log in to the Prefect UI in headless Chromium and check the flow
# run's page and artifacts; stop a worker while its broker is down (it exits at once, not at
# the engine's SIGKILL); check that 'inspect' of every container shows no password and that
# each drops its capabilities with a read-only root; tear everything down. One line per step with its seconds; the first
# failure stops it (exit 1) after printing the end of that step's log.
#
# Engine: Docker when 'docker info' answers, else podman through its Docker-compatible socket
# (started here, stopped at the end). Compose: 'docker compose', else 'docker-compose'.
# Without a registry for python:3.11-slim and rabbitmq:3.13 it builds stand-ins from Debian's
# packages (deploy/stand-in-images.sh) and says so. Images stay for the next run (fedboost:latest
# and the base images); containers, volumes, networks, keys and certificates do not.
# Needs: fedboost on PATH (pip install .), openssl, chromium; and no deploy/keys or deploy/tls
# yet (it makes its own and removes them at the end; a deployment's keys are never touched).
set -euo pipefail

cd "$(dirname "$0")/.."
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-fedboost-smoke}
work=$(mktemp -d)
python=$(head -1 "$(command -v fedboost)" | sed 's/^#!//')  # the fedboost command's Python
checks() { "$python" deploy/smoke_checks.py "$@"; }
shots=runs/compose-smoke  # the Prefect UI's screenshot stays here
mkdir -p "$shots"
state=$work/state  # what a step keeps for the next ones and the tear-down: 'keep NAME VALUE'
: > "$state"
podman_pid="" health_pid="" made_keys="" compose=""
started=$EPOCHREALTIME
. deploy/smoke-lib.sh  # step, say, note, keep, engine_and_compose, base_images, wait_healthy
trees=${SMOKE_TREES:-8}  # trees of each vertical run

# shown when a step fails, after its log: what the services said, before the tear-down
# removes them
step_failed() {
  if [ -n "$compose" ]; then
    echo "     the services' last log lines (compose logs --tail 25):"
    $compose --profile horizontal --profile scoring logs --no-color --tail 25 2>&1 \
      | sed 's/^/     | /'
  fi
}

teardown() {
  local code=$? begin=$EPOCHREALTIME
  set +e
  if [ -n "$health_pid" ]; then kill "$health_pid" 2> /dev/null; wait "$health_pid" 2>/dev/null; fi
  if [ -n "$compose" ]; then
    $compose --profile horizontal --profile scoring down --volumes --remove-orphans --timeout 30 \
      > "$work/down.log" 2>&1 || tail -n 5 "$work/down.log" | sed 's/^/     | /'
    left=$(for kind in container volume network; do
      $engine $kind ls -q --filter "label=$project"
    done | xargs)
  fi
  if [ -n "$made_keys" ]; then
    rm -rf deploy/keys deploy/tls deploy/passwords deploy/scoring-keys deploy/scoring-tls
    rm -f deploy/host-scoring.yaml
    cp "$work/definitions.json" deploy/definitions.json
  fi
  if [ -n "$podman_pid" ]; then kill "$podman_pid" 2> /dev/null; wait "$podman_pid" 2>/dev/null; fi
  printf '%s   %6s s  %s\n' "$([ -z "${left:-}" ] && echo ok || echo FAIL)" \
    "$(since "$begin")" \
    "tear down: containers, volumes, networks, keys and certificates removed"
  if [ -n "${left:-}" ]; then echo "     | left behind: $left"; code=1; fi
  rm -rf "$work"
  say "done (exit $code)"
  exit "$code"
}
trap teardown EXIT
trap 'exit 130' INT TERM

project=com.docker.compose.project=$COMPOSE_PROJECT_NAME  # the label of what compose made
health_labels() { echo "$project"; }

secrets_and_keys() {  # docs/operations.md, "docker compose", step by step
  if [ -e deploy/keys ] || [ -e deploy/tls ] || [ -e deploy/passwords ]; then
    echo "deploy/keys or deploy/tls exists: a deployment's keys; run from a fresh clone"
    return 1
  fi
  cp deploy/definitions.json "$work/definitions.json"
  keep made_keys yes
  mkdir -m 700 deploy/passwords
  for name in guest host host_1 host_2 aggregator flow; do
    (umask 077; openssl rand -hex 24 > "deploy/passwords/$name")
  done
  (umask 077; echo "admin:$(openssl rand -hex 24)" > deploy/passwords/prefect-auth)
  # this script's own checks of the Prefect API (deploy/smoke_checks.py), on the host only
  keep FEDBOOST_PREFECT_AUTH_STRING "$(cat deploy/passwords/prefect-auth)"
  fedboost definitions --party guest=@deploy/passwords/guest --party host=@deploy/passwords/host \
    --party host_1=@deploy/passwords/host_1 --party host_2=@deploy/passwords/host_2 \
    --party aggregator=@deploy/passwords/aggregator --flow-password @deploy/passwords/flow \
    --out deploy/definitions.json
  fedboost keys --out deploy/keys --local-trial --name guest --name host --name host_1 \
    --name host_2 --name aggregator --name flow
  deploy/make-certs.sh -o deploy/tls guest host host_1 host_2 aggregator flow
  deploy/make-certs.sh -o deploy/scoring-tls -s localhost  # the scoring service's HTTPS
  mkdir -m 700 deploy/scoring-keys
  # a free port for the Prefect UI: the variable works, and a Prefect on 4200 here is no clash
  keep FEDBOOST_PREFECT_PORT "$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  keep FEDBOOST_SCORING_USER "$(id -u):$(id -g)"
  note "$(ls deploy/keys/*.key deploy/tls/*.key deploy/passwords/* | wc -l) private keys and" \
    "password files, mode 0600, owned by $(id -un): no chown"
}

build() {
  local before after
  before=$($engine images -q | sort -u | wc -l)
  $compose --profile horizontal --profile scoring build
  after=$($engine images -q | sort -u | wc -l)
  # one fedboost service builds (prefect-server); every other one runs its image
  local built
  built=$($compose --profile horizontal --profile scoring config | "$python" -c '
import sys, yaml
services = yaml.safe_load(sys.stdin)["services"]
print(" ".join(n for n, s in services.items() if "build" in s))')
  echo "services that build: $built; images $before -> $after"
  [ "$built" = prefect-server ]
  local cache
  cache=$($engine run --rm --user root --entrypoint sh fedboost:latest -c \
    'find /var/cache/apt /var/lib/apt/lists -type f | wc -l')
  echo "files in the apt cache and lists: $cache"
  [ "$cache" = 0 ]
  local size
  size=$($engine image inspect -f '{{.Size}}' fedboost:latest)
  # .dockerignore: the keys and certificates made above never reach the image
  local found
  found=$($engine run --rm --user root --entrypoint find fedboost:latest / -xdev \
    \( -name '*.key' -o -name '*.pub' -o -name '*.pem' -o -name 'definitions.json' \) \
    -not -path '/usr/*' -not -path '/etc/ssl/*' -not -path '/proc/*')
  if [ -n "$found" ]; then echo "the image holds $found"; return 1; fi
  note "fedboost:latest ($((size / 1000000)) MB, built once for every fedboost service, no apt" \
    "cache) holds no key, certificate or definitions"
}

service_ids() { $compose --profile horizontal --profile scoring ps -q "$@"; }

wait_all_healthy() { wait_healthy "$1" $(service_ids); }

# deployment_run NAME [--params JSON]: start a run of the runner's deployment; its id in run_id
deployment_run() {
  local out
  out=$($compose exec -T --user fedboost runner prefect deployment run "$@")
  echo "$out"
  run_id=$(sed -n 's/.*UUID: *\([0-9a-f-]\{36\}\).*/\1/p' <<< "$out" | head -1)
  [ -n "$run_id" ]
  # the link it prints opens on this machine, not the in-network name prefect-server
  grep -q "http://localhost:$FEDBOOST_PREFECT_PORT/runs/flow-run/$run_id" <<< "$out"
}

# model_digests SERVICE PARTY JOB: each file of the party's model folder with its SHA-256, but
# for the time it was saved ('saved_at', the one field two runs of a job differ in)
model_digests() {
  $compose exec -T "$1" python -c "
import hashlib, json, pathlib, sys
folder = pathlib.Path('/models/$3/$2')
files = sorted(p for p in folder.glob('*.json'))
if not any(p.name in ('model.json', 'lookup.json') for p in files):
    sys.exit(f'no model in {folder} of $1: {[p.name for p in folder.iterdir()]}')
for p in files:
    content = json.loads(p.read_bytes())
    content.pop('saved_at', None)
    print(p.name, hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16])"
}

train() {  # train LABEL DEPLOYMENT JOB SERVICE:PARTY... [--params JSON]
  local label=$1 deployment=$2 job=$3 parties=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != --params ]; do parties+=("$1"); shift; done
  deployment_run "$deployment" "$@"
  checks wait-run "$run_id" 1800
  models "$label" "$job" "${parties[@]}"
  cat "$work/$label.models"
  keep "${label}_run" "$run_id"
  note "run $run_id completed; model parts of" \
    "$(cut -d' ' -f1 "$work/$label.models" | sort -u | xargs | tr ' ' ',')"
}

# vertical_job [KEY=VALUE...]: the vertical deployment's default job (deploy/job.yaml) with
# $trees trees, a run's --params: its 30 trees take half an hour on a busy 2-core machine
vertical_job() { checks params deploy/job.yaml "params.n_trees=$trees" "$@"; }

trees_checkpointed() {  # the host's newest checkpoint of job default-credit (0: none)
  $compose exec -T worker-host sh -c 'ls /models/default-credit/host/checkpoints 2>/dev/null' |
    sed -n 's/^trees-0*\([0-9][0-9]*\)\.ckpt$/\1/p' | sort -n | tail -1 | grep . || echo 0
}

wait_trees() {
  local deadline=$((SECONDS + 900))
  until [ "$(trees_checkpointed)" -ge "$1" ]; do
    [ $SECONDS -lt "$deadline" ] || { echo "no tree $1 checkpointed"; return 1; }
    sleep 2
  done
}

# models LABEL JOB SERVICE:PARTY...: the digests of each party's model files in $work/LABEL.models
models() {
  local label=$1 job=$2 pair
  shift 2
  : > "$work/$label.models"
  for pair in "$@"; do
    model_digests "${pair%%:*}" "${pair#*:}" "$job" | sed "s/^/${pair#*:} /" \
      >> "$work/$label.models"
  done
}

same_model() {  # same_model LABEL: the vertical job's model files equal the first run's
  models "$1" default-credit worker-guest:guest worker-host:host
  diff "$work/vertical.models" "$work/$1.models"
}

crash_worker() {
  deployment_run vertical_secureboost/default-credit --params "$(vertical_job)"
  wait_trees 3
  local container restarts now
  container=$(service_ids worker-host)
  restarts=$($engine inspect -f '{{.RestartCount}}' "$container")
  # the worker's process dies as in a crash (kill -9 by the kernel's OOM killer, a segfault)
  $compose exec -T --user fedboost worker-host python -c \
    "import os, signal; os.kill(-1, signal.SIGKILL)" || true
  for _ in $(seq 60); do
    now=$($engine inspect -f '{{.RestartCount}}' "$container")
    [ "$now" -gt "$restarts" ] && break
    sleep 1
  done
  echo "worker-host: RestartCount $restarts -> $now"
  [ "$now" -gt "$restarts" ]
  checks wait-run "$run_id" 1800
  same_model crash
  note "killed after tree 3, restarted by its policy ($restarts -> $now restarts); the run" \
    "resumed and completed with the first run's model"
}

stop_worker() {
  # a shorter step timeout for this run only (the shipped jobs wait 300 s for a silent party)
  deployment_run vertical_secureboost/default-credit \
    --params "$(vertical_job transport.step_timeout=60)"
  wait_trees 2
  local container begin
  container=$(service_ids worker-host)
  $engine kill "$container"
  begin=$SECONDS
  if checks wait-run "$run_id" 600 > "$work/stopped.txt"; then
    cat "$work/stopped.txt"; echo "the run completed without worker-host"; return 1
  fi
  cat "$work/stopped.txt"
  grep -q "party host" "$work/stopped.txt"
  [ "$($engine inspect -f '{{.State.Running}}' "$container")" = false ]
  local failed_after=$((SECONDS - begin))
  echo "failed $failed_after s after the kill, naming host; worker-host still down"
  $compose --profile horizontal up -d worker-host
  wait_all_healthy 300
  checks retry "$run_id"
  checks wait-run "$run_id" 1800
  same_model stopped
  note "stopped by hand: the run failed $failed_after s later naming party host; restarted" \
    "and retried, it resumed to the same model"
}

scoring() {  # the vertical model served; a key revoked on the host is refused in the container
  local key code
  key=$(fedboost serve-model-keys --keys deploy/scoring-keys/api-keys.json add smoke | grep -o 'fbk_[A-Za-z0-9_-]*' | head -1)
  [ -n "$key" ]
  # the host's operator consents to scoring in its own worker file, as docs/operations.md says
  # (the shipped deploy/host.yaml answers path-mode prediction only, and the service would stop)
  "$python" -c 'import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
config["policy"]["predict_modes"] = ["path", "batched"]
yaml.safe_dump(config, open(sys.argv[2], "w"), sort_keys=False)' deploy/host.yaml deploy/host-scoring.yaml
  chmod 644 deploy/host-scoring.yaml
  # for every later compose command too: one without it would recreate worker-host on the
  # shipped file (as 'up scoring' did, its dependency), and the service would stop again
  export HOST_CONFIG=./deploy/host-scoring.yaml
  keep HOST_CONFIG "$HOST_CONFIG"
  $compose --profile horizontal up -d worker-host
  wait_all_healthy 300
  $compose --profile scoring up -d scoring
  wait_all_healthy 300
  score() {
    curl -s -o "$work/score.json" -w '%{http_code}' --cacert deploy/scoring-tls/ca.pem \
      -H "Authorization: Bearer $key" -H "Content-Type: application/json" \
      "https://localhost:${FEDBOOST_SCORING_PORT:-8443}/v1/score" -d '{"ids": ["25115", "2346"]}'
  }
  code=$(score); cat "$work/score.json"; echo
  [ "$code" = 200 ]
  fedboost serve-model-keys --keys deploy/scoring-keys/api-keys.json revoke smoke
  local begin=$EPOCHREALTIME
  for _ in $(seq 50); do code=$(score); [ "$code" = 401 ] && break; sleep 0.2; done
  [ "$code" = 401 ]
  note "scoring (healthy by /livez) answered 200; the key revoked on the host was refused" \
    "$(since "$begin") s later"
}

stop_without_broker() {  # SIGTERM while the worker waits for its broker: it exits at once
  local container begin took broker
  # the broker too stops on SIGTERM (writes its queues, closes its connections), not at the
  # SIGKILL after its stop_grace_period
  begin=$EPOCHREALTIME
  $compose stop -t 60 rabbitmq
  broker=$(since "$begin")
  echo "rabbitmq stopped in $broker s"
  awk -v t="$broker" 'BEGIN { exit !(t < 30) }'
  container=$(service_ids worker-host)
  for _ in $(seq 60); do
    $engine logs --tail 10 "$container" 2>&1 | grep -q "cannot reach the broker" && break
    sleep 1
  done
  $engine logs --tail 5 "$container" 2>&1 | grep "cannot reach the broker"
  begin=$EPOCHREALTIME
  $compose stop -t 60 worker-host
  took=$(since "$begin")
  echo "worker-host stopped in $took s; its last lines:"
  # each of its two processes says why it stopped, among their other last lines
  $engine logs --tail 30 "$container" > "$work/host-stop.log" 2>&1
  tail -n 8 "$work/host-stop.log"
  grep -q "stopped while waiting for the broker" "$work/host-stop.log"
  awk -v t="$took" 'BEGIN { exit !(t < 20) }'
  $compose --profile horizontal up -d rabbitmq worker-host
  note "the broker stopped in $broker s; worker-host, stopped while its broker was down," \
    "exited $took s after SIGTERM (stop_grace_period 60 s each)"
}

no_password_in_inspect() {  # every password is a file: no container's inspect shows one
  local ids secret found="" container
  ids=$($engine ps -aq --filter "label=$project")
  for container in $ids; do
    $engine inspect "$container" > "$work/inspect.json"
    for secret in deploy/passwords/*; do
      if grep -qF "$(head -1 "$secret")" "$work/inspect.json"; then
        found+=" $(basename "$secret")@$($engine inspect -f '{{.Name}}' "$container")"
      fi
    done
    "$python" - "$work/inspect.json" <<'PY'
import json, sys
(c,) = json.load(open(sys.argv[1]))
host = c["HostConfig"]
name = c["Name"]
# Docker lists cap_drop as given (ALL); podman 4 as the defaults it dropped, the ones
# cap_add gave back not among them (this machine, 2026-12-02: 8 of its 11 defaults listed for
# a key holder, the fedboost processes' CapEff 0, the root init's 0xeb = the six of
# docker-compose.yml)
drops = {x.upper().removeprefix("CAP_") for x in host.get("CapDrop") or []}
dropped = {"NET_RAW", "MKNOD", "SYS_CHROOT", "SETFCAP", "SETPCAP", "AUDIT_WRITE", "FSETID",
           "NET_BIND_SERVICE"}
# KILL: kept by a key holder's init (root, as the container's user) to pass SIGTERM on to
# fedboost; podman lists no CapAdd, only the defaults it dropped
adds = {x.upper().removeprefix("CAP_") for x in host.get("CapAdd") or []}
if "KILL" not in adds and c["Config"].get("User") not in ("root", "0"):
    dropped.add("KILL")
assert "ALL" in drops or dropped <= drops, (name, drops)
assert host.get("ReadonlyRootfs") is True or "rabbitmq" in name, (name, "root not read-only")
assert any("no-new-privileges" in o for o in host.get("SecurityOpt") or []), (name, "new privileges")
PY
  done
  if [ -n "$found" ]; then echo "passwords in inspect:$found"; return 1; fi
  note "$(wc -w <<< "$ids") containers: no password in inspect; capabilities dropped," \
    "no new privileges, read-only roots (the broker's aside)"
}

main() {
  say "compose smoke test of $(git rev-parse --short HEAD 2>/dev/null || echo this tree) in $PWD"
  step "engine and compose" engine_and_compose
  step "base images" base_images docker.io/library/python:3.11-slim docker.io/library/rabbitmq:3.13
  step "passwords, definitions, signing keys, TLS certificates" secrets_and_keys
  step "docker compose build" build
  step "docker compose up -d (profile horizontal)" $compose --profile horizontal up -d
  step "every container healthy" wait_all_healthy 600
  step "vertical deployment run ($trees trees) to completion, model volumes" \
    train vertical vertical_secureboost/default-credit default-credit \
    worker-guest:guest worker-host:host --params "$(vertical_job)"
  # the aggregator keeps no model: each member holds the whole of it
  step "horizontal deployment run (its default job) to completion, model volumes" \
    train horizontal horizontal/default-credit credit-homo \
    worker-guest:guest worker-host1:host_1 worker-host2:host_2
  step "scoring service: health, a score, a key revoked on the host" scoring
  step "worker-host's process killed mid-run" crash_worker
  step "worker-host stopped by hand mid-run" stop_worker
  step "Prefect UI (login, flow run page, artifacts) in headless Chromium" \
    checks ui "$vertical_run" "$shots/prefect-ui.png"
  step "inspect of every container: no password, no capabilities, read-only root" \
    no_password_in_inspect
  step "worker-host stopped while its broker is down" stop_without_broker
}

# the whole script is read before it runs: editing it meanwhile changes nothing
main "$@"
