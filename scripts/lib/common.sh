# shellcheck shell=bash
# Shared helpers for scripts/*.sh. Source it; it defines ROOT and a few functions.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STACK_DIR="$ROOT/.stack"
VENV_DIR="$ROOT/.venv"
ENV_FILE="$ROOT/.env"
# Python keeps the bytecode of what it imports (.venv's tools, installed
# uncompiled: see stack.sh). A machine that sets PYTHONDONTWRITEBYTECODE
# (CI's does) made every start compile its imports again: 2.1 s of CPU for
# each process that imports the x402 SDK, and moto, sam, cfn-lint and
# checkov alike.
unset PYTHONDONTWRITEBYTECODE

log()  { printf '%s: %s\n' "${LOG_TAG:-reeve}" "$*" >&2; }
die()  { printf '%s: error: %s\n' "${LOG_TAG:-reeve}" "$*" >&2; exit 1; }

# ------------------------------------------------- .env (stack.sh, payments.sh)
# .env has four readers: the shell (`. .env`, load_dev_env below), dotenvy
# (`reeve`), cargo lambda's `--env-file` (the README's `cargo lambda watch`)
# and python-dotenv (sam-check.sh's `--env-vars` file for `sam local
# invoke`). cargo lambda refuses an unquoted value holding `=` (a chain's
# `eip155:84532=http://…`), and the shell would expand `$` or split on
# spaces; all four take a single-quoted value literally. So a value with
# anything beyond [A-Za-z0-9_.,:/@+-] is written single-quoted.
ENV_PLAIN='^[A-Za-z0-9_.,:/@+-]*$'

# The .env line for KEY ($1) and VALUE ($2).
env_line() {
  if [[ $2 =~ $ENV_PLAIN ]]; then
    printf '%s=%s\n' "$1" "$2"
  elif [[ $2 != *"'"* ]]; then
    printf "%s='%s'\n" "$1" "$2"
  else
    die "$1: a .env value cannot hold a single quote"
  fi
}

# The value of KEY ($1) in .env (its last line), unquoted; empty if absent.
env_get() {
  [[ -f $ENV_FILE ]] || return 0
  local value
  value=$(sed -n "s/^$1=//p" "$ENV_FILE" | tail -n1)
  if [[ $value =~ ^\'(.*)\'$ || $value =~ ^\"(.*)\"$ ]]; then value=${BASH_REMATCH[1]}; fi
  printf '%s\n' "$value"
}

# Appends KEY=VALUE to .env unless KEY is there already (a developer's
# own value stays).
env_add() {
  [[ -f $ENV_FILE ]] || return 0
  grep -q "^$1=" "$ENV_FILE" || env_line "$1" "$2" >>"$ENV_FILE"
}

# Load the development .env into the environment (KEY=value lines) and put
# the project virtualenv first on PATH, so `cargo lambda` finds zig, and `sam`,
# `weed`, `moto_server` come from the pinned venv.
load_dev_env() {
  [[ -f "$ENV_FILE" ]] || die "$ENV_FILE is missing; run scripts/stack.sh up"
  set -a
  # shellcheck disable=SC1090
  . "$ENV_FILE"
  set +a
  export PATH="$VENV_DIR/bin:$PATH"
  export SAM_CLI_TELEMETRY=0
}

# The target triple cargo lambda builds for (`sam build` runs `cargo build
# --target` with it): x86_64, the template's default architecture and the
# only one scripts/sam-check.sh invokes.
LAMBDA_TARGET=x86_64-unknown-linux-gnu

# clippy-driver wraps rustc for the workspace's own crates, every warning an
# error (scripts/test.sh says why the lints run inside the build). The
# wrapper is part of what cargo fingerprints: every cargo meant to reuse
# that build sets the same.
lint_in_build() {
  export RUSTC_WORKSPACE_WRAPPER
  RUSTC_WORKSPACE_WRAPPER="$(rustc --print sysroot)/bin/clippy-driver"
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
  [[ -x $RUSTC_WORKSPACE_WRAPPER ]] || die "no clippy-driver beside rustc ($RUSTC_WORKSPACE_WRAPPER): rustup component add clippy"
}

# The `reeve` binary the script phases run (migrate, serve): the one the
# workspace's `cargo test` just built, so no phase rebuilds it with other
# features (`cargo build -p reeve-cli` alone resolves features differently
# from the workspace build, and would rebuild half of it); built when
# missing. REEVE_BIN overrides it.
reeve_bin() {
  REEVE_BIN="${REEVE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/${CARGO_BUILD_TARGET:+$CARGO_BUILD_TARGET/}debug/reeve}"
  [[ -x $REEVE_BIN ]] || cargo build --locked -q -p reeve-cli --bin reeve || die "cannot build reeve"
  export REEVE_BIN
}

# ensure_venv NAME REQUIREMENTS: a virtualenv of its own under
# .stack/venvs/NAME for tools whose pins clash with the project venv's,
# installed from REQUIREMENTS and made again when they (or the Python)
# change. Prints its directory.
ensure_venv() {
  local dir="$STACK_DIR/venvs/$1" reqs=$2 stamp want
  stamp="$dir/.reeve-requirements.sha256"
  want=$(cat "$reqs" <(python3 -c 'import sys; print(sys.version)'; echo "$dir") | sha256sum | cut -d' ' -f1)
  if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    log "installing ${reqs#"$ROOT"/} into $dir"
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    python3 -m venv "$dir" &&
      "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$reqs" >&2 ||
      { log "installing ${reqs#"$ROOT"/} failed"; return 1; }
    echo "$want" >"$stamp"
  fi
  printf '%s\n' "$dir"
}

# Run "$@" and print how long it took, tagged with a phase name.
timed() {
  local name=$1; shift
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  log "phase '$name' took $((SECONDS - t0))s (exit $rc)"
  return "$rc"
}

# ------------------------------------------------- processes (stack.sh, payments.sh)
# Each script sets HOST (127.0.0.1) before using port_open.

# Is something accepting TCP connections on $HOST:$1?
port_open() { (exec 3<>"/dev/tcp/${HOST:-127.0.0.1}/$1") 2>/dev/null; }

# Is process $1 alive? (A zombie is not: PID 1 here may be slow to reap.)
pid_alive() {
  local st
  kill -0 "$1" 2>/dev/null || return 1
  st=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\).*/\1/p' "/proc/$1/stat" 2>/dev/null || true)
  [[ $st != Z ]]
}

# pid from a pid file if that process is alive and its command line contains $2.
live_pid() {
  local file=$1 pat=$2 pid
  [[ -s $file ]] || return 1
  pid=$(head -n1 "$file" | tr -dc 0-9)
  [[ -n $pid ]] && pid_alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pat" || return 1
  echo "$pid"
}

# wait_for NAME TIMEOUT LOGFILE CMD...: poll CMD until it succeeds or time runs out.
wait_for() {
  local name=$1 timeout=$2 logf=$3; shift 3
  local end=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then
      log "$name did not become ready within ${timeout}s; last lines of $logf:"
      tail -n 40 "$logf" >&2 2>/dev/null || true
      die "$name failed to start"
    fi
    sleep 0.3
  done
}

# Stop pid $1 with TERM, then KILL after $2 seconds (15 by default).
stop_pid() {
  local pid=$1 grace=${2:-15} end
  kill "$pid" 2>/dev/null || return 0
  end=$((SECONDS + grace))
  while pid_alive "$pid"; do
    if ((SECONDS >= end)); then kill -9 "$pid" 2>/dev/null || true; break; fi
    sleep 0.2
  done
}

# Start a long-running command detached (own session, no stdio tied to ours).
# It must not inherit the scripts' locks (fd 8: payments.sh, fd 9: stack.sh):
# a lock held by a running daemon made every later `up` wait and fail.
start_bg() {
  local pidfile=$1 logf=$2; shift 2
  setsid "$@" </dev/null >>"$logf" 2>&1 8>&- 9>&- &
  echo $! >"$pidfile"
}
