#!/usr/bin/env bash
# Run Reeve locally: start the stack, load .env, migrate, then serve every
# route, the relay and a worker in one process, and print where it all is.
# It runs on the development catalog (.env's REEVE_CATALOG, reeve.dev.toml).
#   scripts/dev.sh [serve args, e.g. --bind 127.0.0.1:8080 or --no-worker]
set -euo pipefail
LOG_TAG="dev"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$ROOT"

bash scripts/stack.sh up
load_dev_env
cargo build --locked -p reeve-cli --bin reeve
REEVE="$ROOT/target/debug/reeve"
"$REEVE" migrate

# The address serve listens on: its --bind, else its default.
BIND=127.0.0.1:8080
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --bind) BIND=${args[i + 1]:-$BIND} ;;
    --bind=*) BIND=${args[i]#--bind=} ;;
  esac
done
API="http://$BIND"

# The development catalog's `wordfreq` kinds run examples/wordfreq, a Lambda
# function (docs/executors.md): `cargo lambda watch` serves it where .env's
# AWS_ENDPOINT_URL_LAMBDA points the worker's Invoke client, in a process
# group of its own (it runs `cargo run` and the function under it),
# reporting its progress every 100 lines (README.md has about 1,300).
LAMBDA_ADDR=${AWS_ENDPOINT_URL_LAMBDA:-http://127.0.0.1:9107}
LAMBDA_ADDR=${LAMBDA_ADDR#http://}
WATCH_LOG="$STACK_DIR/wordfreq-watch.log"
setsid cargo lambda watch -p wordfreq -A "${LAMBDA_ADDR%:*}" -P "${LAMBDA_ADDR##*:}" --concurrency 4 --env-var WORDFREQ_REPORT_EVERY=100 \
  </dev/null >"$WATCH_LOG" 2>&1 &
WATCH_PID=$!
trap 'kill -- "-$WATCH_PID" 2>/dev/null || true' EXIT

"$REEVE" serve "$@" &
SERVE_PID=$!
# Ctrl-C / SIGTERM go to serve, which finishes the work in flight and exits.
trap 'kill -TERM "$SERVE_PID" 2>/dev/null || true' INT TERM

for _ in $(seq 1 100); do
  curl -fsS "$API/healthz" >/dev/null 2>&1 && break
  kill -0 "$SERVE_PID" 2>/dev/null || { wait "$SERVE_PID" || true; die "reeve serve exited; see its log above"; }
  sleep 0.2
done

PG_ADDR=$(sed -E 's#^[^@]*@([^/?]+).*#\1#' <<<"$DATABASE_URL")
cat >&2 <<BANNER

  Reeve is running (Ctrl-C stops it).
    API          $API        (OpenAPI: $API/v1/openapi.json)
    relay page   $API/
    stack        Postgres $PG_ADDR  Redis ${REDIS_URL#redis://}  S3 ${AWS_ENDPOINT_URL_S3#http://}  SQS ${AWS_ENDPOINT_URL_SQS#http://}
    wordfreq     http://$LAMBDA_ADDR  (examples/wordfreq under cargo lambda watch; log: $WATCH_LOG)

  Your first task, from another terminal in $ROOT:
    export PATH="$ROOT/target/debug:\$PATH"
    reeve space create
    reeve login
    reeve task create digest --file upload_id=README.md --watch
    reeve task create wordfreq --file upload_id=README.md --watch

BANNER

# `wait` returns early when a trapped signal arrives: keep waiting for serve.
while kill -0 "$SERVE_PID" 2>/dev/null; do
  wait "$SERVE_PID" || true
done
