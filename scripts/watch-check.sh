#!/usr/bin/env bash
# The README's local Lambda loop, run as the README gives it (its section
# "Running the Lambda functions locally", docs/local-lambda.md):
#
#   cargo lambda watch -A 127.0.0.1 --env-file .env
#
# then one user's way through every HTTP function's URL on it (create a
# Space and open a session with auth, read the catalog, presign an upload
# and PUT it to S3, create a digest task of it, read it and cancel it with
# task-status, initialize with mcp), and the README's
#
#   cargo lambda invoke --invoke-address 127.0.0.1 auth --data-file events/auth-create-space.json
#
# scripts/test.sh runs it after the workspace's debug build, which also
# built what watch's `cargo run --bin <function>` needs (see Cargo.toml's
# note on strsim), so it costs seconds; a crate watch had to compile anyway
# is named in a warning.
#
# watch gets only .env (through --env-file) and PATH: nothing of .env is
# exported here, so a variable .env lacks or a line watch cannot read fails
# this check as it would fail a developer. REEVE_WATCH_PORT moves it off
# 9000 (the README's default).
set -euo pipefail
LOG_TAG="watch-check"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$ROOT"
[[ -f $ENV_FILE ]] || die "$ENV_FILE is missing; run scripts/stack.sh up"
export PATH="$VENV_DIR/bin:$PATH"
HOST=127.0.0.1
PORT=${REEVE_WATCH_PORT:-9000}
WORK="$STACK_DIR/watch-check"
mkdir -p "$WORK"
rm -f "$WORK"/*

# The README's prerequisite: the stack's database has the schema. The
# workspace build's reeve reads .env itself.
reeve_bin
"$REEVE_BIN" migrate >&2 || die "reeve migrate failed"

port_open "$PORT" && die "$HOST:$PORT is in use; stop what listens there or set REEVE_WATCH_PORT"
watch=(cargo lambda watch -A "$HOST" --env-file .env)
[[ $PORT == 9000 ]] || watch+=(-P "$PORT")
log "${watch[*]}"
# Its own process group: watch runs `cargo run` and each function under it.
# scripts/test.sh lints inside its build through clippy-driver, for the
# target triple it names: without the same wrapper and triple watch's cargo
# would build every workspace crate again.
setsid env -i PATH="$PATH" HOME="$HOME" ${CARGO_HOME:+CARGO_HOME="$CARGO_HOME"} \
  ${RUSTUP_HOME:+RUSTUP_HOME="$RUSTUP_HOME"} ${CARGO_TARGET_DIR:+CARGO_TARGET_DIR="$CARGO_TARGET_DIR"} \
  ${CARGO_BUILD_TARGET:+CARGO_BUILD_TARGET="$CARGO_BUILD_TARGET"} \
  ${RUSTC_WORKSPACE_WRAPPER:+RUSTC_WORKSPACE_WRAPPER="$RUSTC_WORKSPACE_WRAPPER"} ${CLIPPY_ARGS:+CLIPPY_ARGS="$CLIPPY_ARGS"} \
  "${watch[@]}" </dev/null >"$WORK/watch.log" 2>&1 &
watch_pid=$!
stop_watch() { kill -- "-$watch_pid" 2>/dev/null || true; wait "$watch_pid" 2>/dev/null || true; }
trap stop_watch EXIT
end=$((SECONDS + 60))
until port_open "$PORT"; do
  pid_alive "$watch_pid" || { tail -n 30 "$WORK/watch.log" >&2; die "cargo lambda watch exited"; }
  ((SECONDS < end)) || { tail -n 30 "$WORK/watch.log" >&2; die "cargo lambda watch did not listen on $HOST:$PORT"; }
  sleep 0.2
done

B="http://$HOST:$PORT/lambda-url"
failed=0
# call NAME EXPECTED-STATUS CURL-ARGS...: one request; its body is left in
# $WORK/NAME.json. A function's first request waits for watch to start it.
call() {
  local name=$1 expect=$2 t0=$SECONDS status
  shift 2
  status=$(curl -sS -m 600 -o "$WORK/$name.json" -w '%{http_code}' "$@") || status=000
  if [[ $status == "$expect" ]]; then
    log "ok   $name: $status ($((SECONDS - t0))s)"
  else
    log "FAIL $name: expected $expect, got $status: $(head -c 300 "$WORK/$name.json" 2>/dev/null)"
    failed=1
    return 1
  fi
}
# field NAME KEY: a top-level string of a saved answer.
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$WORK/$1.json" "$2"; }
json=(-H 'content-type: application/json')

flow() {
  call catalog 200 "$B/catalog/v1/catalog" || return
  call space 201 -X POST "$B/auth/v1/spaces" || return
  call session 200 "${json[@]}" -d "{\"space_id\":\"$(field space space_id)\"}" "$B/auth/v1/sessions" || return
  local token input=README.md size
  token=(-H "authorization: Bearer $(field session token)")
  size=$(stat -c %s "$input")
  call presign 201 "${token[@]}" "${json[@]}" \
    -d "{\"filename\":\"README.md\",\"content_type\":\"text/plain\",\"size\":$size}" "$B/presign/v1/uploads" || return
  call upload 200 -X PUT -H 'content-type: text/plain' --data-binary "@$input" "$(field presign url)" || return
  call task-create 202 "${token[@]}" "${json[@]}" \
    -d "{\"input\":{\"upload_id\":\"$(field presign upload_id)\"}}" "$B/task-create/v1/tasks/digest" || return
  local task
  task=$(field task-create id)
  call task-status 200 "${token[@]}" "$B/task-status/v1/tasks/$task" || return
  # No worker runs under watch: cancel it, so the stack's queue keeps no
  # task of this check's.
  call task-cancel 200 "${token[@]}" -X POST "$B/task-status/v1/tasks/$task/cancel" || return
  [[ $(field task-cancel status) == canceled ]] || { log "FAIL task-cancel: the task is not canceled"; failed=1; }
  call mcp 200 "${json[@]}" -H 'accept: application/json, text/event-stream' \
    -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"watch-check","version":"0"}}}' \
    "$B/mcp/mcp" || return
}
flow || true

# The README's invoke, with the sample event of a Space's creation.
invoke=(cargo lambda invoke --invoke-address "$HOST" auth --data-file events/auth-create-space.json)
[[ $PORT == 9000 ]] || invoke+=(--invoke-port "$PORT")
if "${invoke[@]}" >"$WORK/invoke.json" 2>"$WORK/invoke.err" &&
   python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); sys.exit(a.get("statusCode") != 201)' "$WORK/invoke.json"; then
  log "ok   ${invoke[*]}: 201"
else
  log "FAIL ${invoke[*]}: $(head -c 300 "$WORK/invoke.json") $(tail -n 5 "$WORK/invoke.err")"
  failed=1
fi

compiled=$(sed -n 's/^ *Compiling \([^ ]*\) .*/\1/p' "$WORK/watch.log" | sort -u | tr '\n' ' ')
[[ -z $compiled ]] || log "warning: watch compiled what the workspace's debug build had not: $compiled"
if ((failed)); then
  log "the watch log (functions' logs included) is $WORK/watch.log; its last lines:"
  tail -n 40 "$WORK/watch.log" >&2
  die "the README's cargo lambda watch loop failed"
fi
log "the README's cargo lambda watch loop works: every HTTP function answered through its URL"
