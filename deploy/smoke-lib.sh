# What the compose smoke scripts share (deploy/compose-smoke.sh, deploy/compose-orgs-smoke.sh):
# sourced, not run. Before sourcing, a script sets $work (its temporary folder), $state (a file
# under it: what a step keeps for the next ones, 'keep NAME VALUE') and $started; it may define
# step_failed (what to print when a step fails, after the step's own log) and health_labels
# (the labels of the containers whose health checks this script runs where podman has no
# systemd). The engine's choice is kept in $engine and $compose, with DOCKER_HOST for podman.

keep() { printf 'export %s=%q\n' "$1" "$2" >> "$state"; }
since() { awk -v now="$EPOCHREALTIME" -v then="$1" 'BEGIN { printf "%.1f", now - then }'; }
say() { printf '%7s s  %s\n' "$(since "$started")" "$*"; }
note() { echo "=> $*"; }  # a step's last line of this form ends its printed line

# step TITLE COMMAND...: run COMMAND (a function or program) in a subshell that stops at its
# first failing command, its output in the step's log; print one line with the step's seconds,
# or stop at its failure
step() {
  local title=$1 begin=$EPOCHREALTIME status log=$work/step.log
  shift
  : > "$log"
  set +e
  (set -e; "$@") >> "$log" 2>&1
  status=$?
  set -e
  . "$state"
  if [ $status = 0 ]; then
    printf 'ok   %6s s  %s%s\n' "$(since "$begin")" "$title" \
      "$(tail -n 1 "$log" | sed -n 's/^=> / : /p')"
  else
    printf 'FAIL %6s s  %s\n' "$(since "$begin")" "$title"
    tail -n 30 "$log" | sed 's/^/     | /'
    if declare -F step_failed > /dev/null; then step_failed; fi
    exit 1
  fi
}

# Docker when 'docker info' answers, else podman through its Docker-compatible socket (started
# here: podman_pid, for the tear-down to stop); compose: 'docker compose', else docker-compose
engine_and_compose() {
  if docker info > /dev/null 2>&1; then
    engine=docker
  elif command -v podman > /dev/null; then
    engine=podman
    if [ -z "${DOCKER_HOST:-}" ]; then
      podman system service --time=0 "unix://$work/podman.sock" > "$work/podman.log" 2>&1 &
      keep podman_pid $!
      export DOCKER_HOST="unix://$work/podman.sock"
      keep DOCKER_HOST "$DOCKER_HOST"
      for _ in $(seq 60); do [ -S "$work/podman.sock" ] && break; sleep 0.5; done
    fi
  else
    echo "neither Docker nor podman is installed"; return 1
  fi
  if docker compose version > /dev/null 2>&1; then
    compose="docker compose"
  elif command -v docker-compose > /dev/null; then
    compose=docker-compose
  else
    echo "no docker compose (the Docker plugin or docker-compose)"; return 1
  fi
  keep engine "$engine"
  keep compose "$compose"
  if [ "$engine" = podman ]; then
    # compose's classic build API: BuildKit would pull its own image (moby/buildkit) offline
    keep DOCKER_BUILDKIT 0
    keep COMPOSE_DOCKER_CLI_BUILD 0
    if [ ! -d /run/systemd/system ]; then
      # podman runs health checks from systemd timers; without systemd, this script runs them
      health_checks > /dev/null 2>&1 &
      keep health_pid $!
    fi
  fi
  note "$engine ($($engine --version | head -1)), $compose${DOCKER_HOST:+ at $DOCKER_HOST}" \
    "$(grep -q health_pid "$state" && echo "(no systemd: this script runs the health checks)")"
}

health_checks() {
  while :; do
    for label in $(health_labels); do
      for container in $(podman ps -q --filter "label=$label"); do
        podman healthcheck run "$container" > /dev/null 2>&1 || true
      done
    done
    sleep 10
  done
}

# base_images IMAGE...: each present, pulled, or else a stand-in built from Debian's packages
# (deploy/stand-in-images.sh, which also builds again a stand-in an older recipe made)
base_images() {
  local missing=""
  for image in "$@"; do
    $engine image inspect "$image" > /dev/null 2>&1 || timeout 120 $engine pull "$image" ||
      missing+=" $image"
  done
  if [ -z "$missing" ]; then
    if [ "$(deploy/stand-in-images.sh "$engine" | tee /dev/stderr | grep -c 'built again')" != 0 ]; then
      note "stand-ins made by an older recipe built again (deploy/stand-in-images.sh)"
      return
    fi
    note "$* present"
    return
  fi
  echo "no registry gave$missing: building stand-ins from Debian's packages"
  deploy/stand-in-images.sh "$engine"
  note "no registry: stand-ins for$missing built from Debian's packages (deploy/stand-in-images.sh)"
}

health='{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}'
# wait_healthy SECONDS CONTAINER...: every one healthy (or running, without a health check)
wait_healthy() {
  local deadline=$((SECONDS + $1)) states
  shift
  while :; do
    states=$($engine inspect -f "$health" "$@")
    if ! grep -qv ' healthy$' <<< "$states"; then
      note "$(wc -l <<< "$states") containers healthy"
      return
    fi
    if [ $SECONDS -gt "$deadline" ]; then echo "$states"; return 1; fi
    sleep 3
  done
}
