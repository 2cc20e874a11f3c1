# shellcheck shell=bash
# Docker for `sam local invoke` (docs/operations.md#local-stack-and-toolchain): Debian's docker.io, a dockerd
# started in the background (no systemd here), logs under .stack/docker/.
# Source it after lib/common.sh; it defines ensure_docker and docker_stop.

DOCKER_DIR="$STACK_DIR/docker"

docker_ready() { docker info >/dev/null 2>&1; }

# Installs docker.io and busybox-static when missing (as root, with apt-get).
docker_packages() {
  local need=()
  command -v dockerd >/dev/null || need+=(docker.io)
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
  ((${#need[@]})) || return 0
  [[ $EUID -eq 0 ]] || die "missing packages: ${need[*]}; run as root or: sudo apt-get install ${need[*]}"
  log "installing Debian packages: ${need[*]}"
  mkdir -p "$DOCKER_DIR"
  local t0=$SECONDS policy=/usr/sbin/policy-rc.d made_policy='' rc=0
  # Keep the package's init scripts from starting a system dockerd.
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
  fi
  {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
  } >"$DOCKER_DIR/apt.log" 2>&1 || rc=$?
  [[ -n $made_policy ]] && rm -f "$policy"
  if ((rc)); then
    tail -n 30 "$DOCKER_DIR/apt.log" >&2
    die "apt-get failed (exit $rc); full log in $DOCKER_DIR/apt.log"
  fi
  log "docker packages installed in $((SECONDS - t0))s"
}

# Starts dockerd unless a daemon already answers. Idempotent.
ensure_docker() {
  docker_packages
  command -v docker >/dev/null || die "no docker client on PATH"
  if docker_ready; then
    return 0
  fi
  [[ $EUID -eq 0 ]] || die "no Docker daemon answers and only root can start one"
  mkdir -p "$DOCKER_DIR"
  local pidfile="$DOCKER_DIR/dockerd.pid" logf="$DOCKER_DIR/dockerd.log" pid
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    log "dockerd (pid $pid) is starting; waiting"
  else
    # A daemon killed without cleanup leaves its pid file, which blocks a restart.
    if [[ -f /var/run/docker.pid ]] && ! kill -0 "$(cat /var/run/docker.pid 2>/dev/null)" 2>/dev/null; then
      rm -f /var/run/docker.pid
    fi
    log "starting dockerd (log: $logf)"
    setsid dockerd --host unix:///var/run/docker.sock </dev/null >>"$logf" 2>&1 9>&- &
    echo $! >"$pidfile"
  fi
  local end=$((SECONDS + 60))
  until docker_ready; do
    if ((SECONDS >= end)) || ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      log "dockerd did not come up; last lines of $logf:"
      tail -n 30 "$logf" >&2 || true
      die "dockerd failed to start"
    fi
    sleep 0.5
  done
  log "dockerd is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
}

# Stops the dockerd this script started (by its pid file), if any.
docker_stop() {
  local pid
  pid=$(cat "$DOCKER_DIR/dockerd.pid" 2>/dev/null || true)
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  log "stopping dockerd"
  kill "$pid" 2>/dev/null || true
  local end=$((SECONDS + 20))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < end)); do sleep 0.3; done
}
