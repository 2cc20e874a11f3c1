# shellcheck shell=bash
# A database and an SQS queue of this run's own on the shared local stack,
# and a real `reeve serve` on a free loopback port, for the test phases that
# drive Reeve from outside (scripts/api-fuzz.sh, scripts/console-test.sh).
# Source it after lib/common.sh and load_dev_env; then:
#   isolated_stack_start NAME   a fresh, migrated database and a queue;
#                               DATABASE_URL and REEVE_QUEUE_URL point at them
#   isolated_serve_start NAME   `reeve serve` there; sets REEVE_TEST_URL
#                               (its log: .stack/NAME-serve.log)
#   isolated_stop               stops what it started, drops both
# The caller should `trap isolated_stop EXIT`.

ISO_PIDS=()
ISO_DB=""
ISO_QUEUE_URL=""
ISO_SERVER=""

iso_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

iso_sqs() { # create NAME | delete URL
  "$VENV_DIR/bin/python" - "$@" <<'PY'
import sys, boto3
sqs = boto3.client("sqs")
if sys.argv[1] == "create":
    print(sqs.create_queue(QueueName=sys.argv[2])["QueueUrl"])
else:
    sqs.delete_queue(QueueUrl=sys.argv[2])
PY
}

isolated_stack_start() {
  local name=$1 suffix
  suffix="$(date +%s)_$$"
  ISO_SERVER="${DATABASE_URL%/*}"
  ISO_DB="reeve_${name//-/_}_$suffix"
  psql -q "$DATABASE_URL" -c "CREATE DATABASE $ISO_DB" >/dev/null || die "cannot create database $ISO_DB"
  export DATABASE_URL="$ISO_SERVER/$ISO_DB"
  ISO_QUEUE_URL=$(iso_sqs create "reeve-$name-$suffix") || die "cannot create a queue"
  export REEVE_QUEUE_URL="$ISO_QUEUE_URL"
  # The development catalog, whatever .env says: these phases pay on the
  # local chain, which reeve.toml (mainnet) does not price on.
  export REEVE_CATALOG="$ROOT/reeve.dev.toml"
  reeve_bin
  "$REEVE_BIN" migrate >/dev/null || die "reeve migrate failed"
  mkdir -p "$STACK_DIR"
}

isolated_serve_start() {
  local name=$1 port
  port=$(iso_free_port)
  export REEVE_TEST_URL="http://127.0.0.1:$port"
  "$REEVE_BIN" serve --bind "127.0.0.1:$port" >"$STACK_DIR/$name-serve.log" 2>&1 &
  ISO_PIDS+=($!)
  local end=$((SECONDS + 60))
  until curl -fsS "$REEVE_TEST_URL/healthz" >/dev/null 2>&1; do
    if ((SECONDS >= end)) || ! kill -0 "${ISO_PIDS[-1]}" 2>/dev/null; then
      tail -n 30 "$STACK_DIR/$name-serve.log" >&2
      die "reeve serve did not become healthy"
    fi
    sleep 0.3
  done
  log "reeve serve at $REEVE_TEST_URL (database $ISO_DB and a queue of its own)"
}

isolated_stop() {
  local pid
  for pid in "${ISO_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${ISO_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  ISO_PIDS=()
  if [[ -n $ISO_QUEUE_URL ]]; then iso_sqs delete "$ISO_QUEUE_URL" >/dev/null 2>&1 || true; fi
  if [[ -n $ISO_DB ]]; then
    psql -q "$ISO_SERVER/postgres" -c "DROP DATABASE IF EXISTS $ISO_DB WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  ISO_DB="" ISO_QUEUE_URL=""
}
