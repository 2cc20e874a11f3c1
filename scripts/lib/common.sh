# shellcheck shell=bash
# Shared helpers for scripts/*.sh. Source it; it defines ROOT and a few functions.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STACK_DIR="$ROOT/.stack"
VENV_DIR="$ROOT/.venv"
ENV_FILE="$ROOT/.env"

log()  { printf '%s: %s\n' "${LOG_TAG:-reeve}" "$*" >&2; }
die()  { printf '%s: error: %s\n' "${LOG_TAG:-reeve}" "$*" >&2; exit 1; }

# Load the development .env into the environment (plain KEY=value lines) and put
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

# Run "$@" and print how long it took, tagged with a phase name.
timed() {
  local name=$1; shift
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  log "phase '$name' took $((SECONDS - t0))s (exit $rc)"
  return "$rc"
}
