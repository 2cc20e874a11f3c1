#!/usr/bin/env bash
# The SAM checks (issue 6, docs/operations.md#local-stack-and-toolchain), run by scripts/test.sh after the
# cargo tests:
#
#   validate  sam validate --lint (offline: cfn-lint on the SAM template)
#   lint      AWS's deploy-time rules: the template translated to plain
#             CloudFormation offline (scripts/lib/sam_translate.py, the SAM
#             CLI's own translator) and linted there by cfn-lint, which only
#             then applies rules such as E3505 (an SQS event source's queue
#             must outlast its function); then checkov on the SAM template,
#             which must find no failed check (each exception is skipped in
#             its resource's Metadata, with the reason); once per variant
#             (LINT_VARIANTS). checkov lives in a virtualenv of its own
#             (scripts/requirements-checkov.txt), installed here when missing.
#   build     sam build: every function, with cargo lambda, every warning
#             an error; the deploy profile (zig, release), or the quick one
#             with SAM_CHECK_PROFILE=quick (scripts/test.sh's debug build:
#             see phase_build); prints the size of every bootstrap
#   deploy    the README's `cargo lambda deploy` of one function (auth, the
#             bootstrap the build phase made) against the local moto
#             server's Lambda API, with a role created there first; then
#             checks the function's handler, runtime, architecture and
#             environment, and deletes both
#   invoke    sam local invoke of every function with its events/ file
#             against the local stack, checking each answer (INVOKES below)
#
#   scripts/sam-check.sh [validate|lint|build|deploy|invoke ...]    (default: all five)
#
# `invoke` needs Docker: Debian's docker.io and a dockerd started here
# (scripts/lib/docker.sh), and the stand-in base image
# reeve/lambda-base:local (scripts/lambda-base-image.sh), since no image can
# be pulled. The functions reach Postgres, Redis, S3 and SQS on 127.0.0.1
# through host networking (scripts/lib/sam_host_network.py) with the values
# of .env, passed as an --env-vars file written at run time under .stack/.
set -euo pipefail
LOG_TAG="sam-check"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source-path=SCRIPTDIR source=lib/docker.sh
. "$ROOT/scripts/lib/docker.sh"
cd "$ROOT"

BUILD_DIR="$ROOT/.aws-sam/build"
WORK_DIR="$STACK_DIR/sam"
BASE_IMAGE="reeve/lambda-base:local"

# Every function of template.yaml, its event file (events/<name>.json) and
# what it must answer: an HTTP status code, or `ok` for an event function
# that must finish without an error. shared/tests/suite/template.rs checks that
# this table covers every function and every event file.
INVOKES=(
  "AuthFunction        auth-create-space  201"
  "AuthFunction        auth-open-session  401"
  "AuthFunction        auth-rotate-space  401"
  "CatalogFunction     catalog            200"
  "PresignFunction     presign            401"
  "TaskCreateFunction  task-create        401"
  "TaskStatusFunction  task-status        401"
  "TaskStatusFunction  task-status-list   401"
  "TaskStatusFunction  task-status-cancel 401"
  "McpFunction         mcp-initialize     200"
  "McpFunction         mcp-tools-list     200"
  "McpFunction         mcp-tools-call-task 200"
  "McpFunction         mcp-tasks-get      200"
  "McpFunction         mcp-tasks-cancel   200"
  "WorkerFunction      sqs-digest         ok"
  "WorkerFunction      sqs-malformed      ok"
  "UploadGuardFunction s3-upload-guard    ok"
  "SweeperFunction     sweeper            ok"
  "SweeperFunction     sweeper-dead-letter ok"
)

# The template as linted: its defaults, and each variant's parameters set
# (NAME PARAMETER=VALUE ...), so conditions are linted both ways.
LINT_VARIANTS=(
  "default"
  "vpc FunctionSubnetIds=subnet-0aaaaaaaaaaaaaaaa,subnet-0bbbbbbbbbbbbbbbb FunctionSecurityGroupIds=sg-0aaaaaaaaaaaaaaaa"
  "services DeployWordfreqExample=true ExecutorFunctionArns=arn:aws:lambda:us-east-1:123456789012:function:pdf ExecutorSecretArns=arn:aws:secretsmanager:us-east-1:123456789012:secret:reeve/pdf-AbCdEf ReceiptKmsKeyArn=arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
)

CHECKOV_REQS="$ROOT/scripts/requirements-checkov.txt"

sam_cli() { SAM_CLI_TELEMETRY=0 sam "$@"; }

# checkov's pinned virtualenv, made again when its requirements change.
ensure_checkov() {
  CHECKOV_VENV=$(ensure_venv checkov "$CHECKOV_REQS") && [[ -x $CHECKOV_VENV/bin/checkov ]]
}

phase_validate() {
  sam_cli validate --lint
}

# cfn-lint runs on the translated template, where it sees what CloudFormation
# will: `sam validate --lint` checks SAM resources only against their schemas
# (cfn-lint dropped its SAM transform in 1.54). W1020 (a Sub with nothing to
# substitute) is the translator's own writing: it resolves LayerName itself.
#
# checkov reads the SAM template itself (it knows SAM's resources), with the
# variant's parameters as defaults, which is how it takes conditions.
phase_lint() {
  mkdir -p "$WORK_DIR"
  ensure_checkov || return
  local failed=0 line name params out dir
  dir=$(mktemp -d "$WORK_DIR/lint.XXXXXX")
  for line in "${LINT_VARIANTS[@]}"; do
    read -r name params <<<"$line"
    out="$dir/translated-$name.json"
    # shellcheck disable=SC2086 # params is a list of NAME=VALUE words
    "$VENV_DIR/bin/python" "$ROOT/scripts/lib/sam_translate.py" template.yaml "$out" --defaults-to "$dir/template-$name.json" $params || return
    if "$VENV_DIR/bin/cfn-lint" --non-zero-exit-code error --ignore-checks W1020 -- "$out"; then
      log "ok   cfn-lint on the translated template ($name)"
    else
      log "FAIL cfn-lint on the translated template ($name): $out"
      failed=1
    fi
    if "$CHECKOV_VENV/bin/checkov" --quiet --compact --skip-download --framework cloudformation \
          -f "$dir/template-$name.json" >"$dir/checkov-$name.txt" 2>&1; then
      log "ok   checkov ($name): $(grep -o 'Passed checks: .*' "$dir/checkov-$name.txt")"
    else
      log "FAIL checkov ($name): fix each failed check, or skip it in its resource's Metadata with the reason:"
      cat "$dir/checkov-$name.txt" >&2
      failed=1
    fi
  done
  ((failed == 0)) || die "the template breaks AWS's deploy-time rules or a checkov check (files kept in $dir)"
  rm -rf "$dir"
}

# SAM_CHECK_PROFILE=quick (what scripts/test.sh asks for) is SAM's debug
# mode (SAM_BUILD_MODE=debug: `cargo lambda build --bin <name>`, no
# --release) with cargo's own linker (CARGO_LAMBDA_COMPILER=cargo, not zig)
# and test.sh's clippy wrapper: exactly the units of test.sh's debug build,
# which names cargo lambda's target triple, so under test.sh it compiles
# nothing and copies the bootstraps (it compiled every dependency a second
# time before: 939 s of a 1751 s CI run). The invocations that follow test
# behaviour, not size or speed. zig would have set a C compiler for the
# target (CC_x86_64_unknown_linux_gnu and the like), which the build scripts
# of the crates with C in them watch, so everything above them would have
# been built again; without it the bootstraps link against this machine's
# glibc, which is what the stand-in base image of the invoke phase carries.
# The default (`deploy`) builds as a plain `sam build` does: Cargo.toml's
# release profile and zig; scripts/bench.sh measures those sizes. Either
# way a warning in any function's build is an error (RUSTFLAGS, or the
# wrapper's CLIPPY_ARGS), and `sam build` runs `cargo lambda build --bin
# <name>` at the workspace root, so with the workspace's features unified:
# reeve-shared is compiled once, with every feature, for all of them.
phase_build() {
  local build_env=()
  case ${SAM_CHECK_PROFILE:-deploy} in
    deploy) build_env=(RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-D warnings") ;;
    quick) lint_in_build
           build_env=(SAM_BUILD_MODE=debug CARGO_LAMBDA_COMPILER=cargo) ;;
    *) die "SAM_CHECK_PROFILE is deploy or quick, not '$SAM_CHECK_PROFILE'" ;;
  esac
  log "sam build (${SAM_CHECK_PROFILE:-deploy} profile)"
  # Heavy when it compiles (a release build of each function): keep it from
  # starving the rest. `timed` runs phases where `set -e` does not apply:
  # fail explicitly.
  nice -n 19 env SAM_CLI_TELEMETRY=0 "${build_env[@]}" sam build || return
  if [[ ${SAM_CHECK_PROFILE:-deploy} == quick ]]; then
    # cargo lambda moved each binary to <target>/lambda/<name>/bootstrap;
    # what runs them from the build directory (the tests, `cargo run`)
    # finds them there again once cargo links them back from deps/ (it
    # compiles nothing: the same command cargo lambda ran).
    local bins=()
    mapfile -t bins < <(sed -n 's/^ *Binary: *\([A-Za-z0-9_-]*\) *$/--bin\n\1/p' template.yaml)
    cargo build --locked -q --target "$LAMBDA_TARGET" "${bins[@]}" || return
  fi
  log "built bootstraps (${SAM_CHECK_PROFILE:-deploy} profile):"
  local f n total=0
  for f in "$BUILD_DIR"/*/bootstrap; do
    n=$(stat -c %s "$f")
    total=$((total + n))
    printf '  %-22s %10s bytes  %6s\n' "$(basename "$(dirname "$f")")" "$n" "$(numfmt --to=iec "$n")" >&2
  done
  printf '  %-22s %10s bytes  %6s\n' total "$total" "$(numfmt --to=iec "$total")" >&2
}

# The README's "Function by function, with cargo lambda": the same command,
# but for a function name of this run's own (moto is shared) and the role
# made for it; cargo lambda finds the build phase's bootstrap in
# <target>/lambda/auth/, where sam build's cargo lambda left it.
phase_deploy() {
  local moto=${AWS_ENDPOINT_URL_SQS:?the local moto server (.env)} name="reeve-check-auth-$$" role target
  target=$(cargo metadata --format-version 1 --no-deps | "$VENV_DIR/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  [[ -f $target/lambda/auth/bootstrap ]] || die "no $target/lambda/auth/bootstrap: run the build phase first"
  role=$(AWS_ENDPOINT_URL=$moto "$VENV_DIR/bin/python" "$ROOT/scripts/lib/moto_lambda.py" role "$name") || return
  # .env points Lambda's Invoke API at the example executor's watch
  # (AWS_ENDPOINT_URL_LAMBDA, which outranks AWS_ENDPOINT_URL): the deploy
  # goes to moto.
  AWS_ENDPOINT_URL=$moto AWS_ENDPOINT_URL_LAMBDA=$moto cargo lambda deploy --binary-name auth "$name" --iam-role "$role" \
    --include reeve.toml --env-var REEVE_CATALOG=/var/task/reeve.toml --merge-env >&2 || return
  AWS_ENDPOINT_URL=$moto AWS_ENDPOINT_URL_LAMBDA=$moto "$VENV_DIR/bin/python" "$ROOT/scripts/lib/moto_lambda.py" check "$name"
}

# The built template, plus the SDK's endpoint variables: `sam local` passes a
# function only the variables its template declares (and AWS_* credentials),
# and the deployed template has no business naming local endpoints. Secrets
# named by ARN become their plain variables, filled from .env.
write_local_template() {
  "$VENV_DIR/bin/python" - "$BUILD_DIR/template.yaml" "$BUILD_DIR/template.local.yaml" <<'PY'
import sys
from samcli.yamlhelper import yaml_dump, yaml_parse
src, dst = sys.argv[1], sys.argv[2]
with open(src) as f:
    template = yaml_parse(f.read())
for resource in template["Resources"].values():
    if resource.get("Type") != "AWS::Serverless::Function":
        continue
    props = resource.setdefault("Properties", {})
    variables = props.setdefault("Environment", {}).setdefault("Variables", {})
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_LAMBDA"):
        variables.setdefault(name, "")
    # Locally a secret is the plain .env value, not a Secrets Manager ARN:
    # each function declares the plain name of exactly the secrets it reads.
    for arn, plain in (("REEVE_PEPPER_SECRET_ARN", "REEVE_PEPPER"),
                       ("REEVE_TOKEN_KEY_SECRET_ARN", "REEVE_TOKEN_KEY"),
                       ("REEVE_DATABASE_URL_SECRET_ARN", "DATABASE_URL"),
                       ("REEVE_RECEIPT_KEY_SECRET_ARN", "REEVE_RECEIPT_KEY"),
                       ("REEVE_BATCH_AUTHORIZER_KEY_SECRET_ARN", "REEVE_BATCH_AUTHORIZER_KEY")):
        if variables.pop(arn, None) is not None:
            variables[plain] = ""
with open(dst, "w") as f:
    f.write(yaml_dump(template))
PY
}

# .env as a sam --env-vars file (for every function). REEVE_CATALOG is the
# template's /opt/reeve.toml, the catalog layer: it must also win over the
# shell's (relative) value, which sam would pass on otherwise. Base mainnet,
# where that catalog prices, gets a chain endpoint.
write_env_vars() {
  (umask 077 && "$VENV_DIR/bin/python" - "$ENV_FILE" "$WORK_DIR/env.json" <<'PY'
import json, sys
from dotenv import dotenv_values
# As the shell reads it: quotes removed, nothing expanded in a quoted value.
values = {k: v for k, v in dotenv_values(sys.argv[1], interpolate=False).items() if v is not None}
values["REEVE_CATALOG"] = "/opt/reeve.toml"
# That catalog prices on Base mainnet, and a function that takes or proves
# payments starts only with a chain endpoint for every network priced: Base's
# public one (no sample event pays, so it is never reached), beside the
# local chain's.
local_chain = values.get("REEVE_CHAIN_RPC_URLS", "")
values["REEVE_CHAIN_RPC_URLS"] = ",".join(filter(None, [local_chain, "eip155:8453=https://mainnet.base.org"]))
# The MCP endpoint answers the Host of the sample events (their API's).
mcp = {"REEVE_MCP_ALLOWED_HOSTS": "a1b2c3d4e5.execute-api.eu-west-1.amazonaws.com"}
with open(sys.argv[2], "w") as f:
    json.dump({"Parameters": values, "McpFunction": mcp}, f)
PY
  )
}

# Checks one invoke's output: the last JSON line on stdout.
check_answer() {
  "$VENV_DIR/bin/python" - "$1" "$2" <<'PY'
import json, sys
out, expect = sys.argv[1], sys.argv[2]
lines = [l for l in open(out).read().splitlines() if l.strip()]
try:
    answer = json.loads(lines[-1])
except (IndexError, ValueError):
    print("no JSON answer on stdout")
    sys.exit(1)
if isinstance(answer, dict) and ("errorType" in answer or "errorMessage" in answer):
    print(f"the function failed: {answer}")
    sys.exit(1)
if expect == "ok":
    print("ok: " + json.dumps(answer)[:160])
    sys.exit(0)
status = answer.get("statusCode") if isinstance(answer, dict) else None
if status != int(expect):
    print(f"expected statusCode {expect}, got {status}: {json.dumps(answer)[:300]}")
    sys.exit(1)
body = (answer.get("body") or "")[:120]
print(f"{status} {body}")
PY
}

phase_invoke() {
  [[ -f $BUILD_DIR/template.yaml ]] || die "no $BUILD_DIR/template.yaml: run the build phase first"
  mkdir -p "$WORK_DIR"
  timed docker ensure_docker || return
  timed base-image bash "$ROOT/scripts/lambda-base-image.sh" "$BASE_IMAGE" || return
  # The functions use the stack's database: it needs the schema.
  reeve_bin
  timed migrate "$REEVE_BIN" migrate >&2 || return
  write_local_template || return
  write_env_vars || return
  local failed=0 line fn event expect out err verdict t0
  for line in "${INVOKES[@]}"; do
    read -r fn event expect <<<"$line"
    out="$WORK_DIR/$event.out" err="$WORK_DIR/$event.log"
    t0=$SECONDS
    if ! "$VENV_DIR/bin/python" "$ROOT/scripts/lib/sam_host_network.py" local invoke "$fn" \
          --template "$BUILD_DIR/template.local.yaml" \
          --event "events/$event.json" \
          --env-vars "$WORK_DIR/env.json" \
          --docker-network host \
          --invoke-image "$BASE_IMAGE" --skip-pull-image \
          --region "${AWS_REGION:-us-east-1}" \
          </dev/null >"$out" 2>"$err"; then
      log "FAIL $fn $event: sam local invoke exited non-zero; last lines of $err:"
      tail -n 20 "$err" >&2
      failed=1
      continue
    fi
    if verdict=$(check_answer "$out" "$expect"); then
      log "ok   $fn $event ($((SECONDS - t0))s): $verdict"
    else
      log "FAIL $fn $event: $verdict; last lines of $err:"
      tail -n 20 "$err" >&2
      failed=1
    fi
  done
  ((failed == 0)) || die "some sam local invokes failed (logs in $WORK_DIR)"
}

main() {
  load_dev_env
  local phases=("$@")
  ((${#phases[@]})) || phases=(validate lint build deploy invoke)
  local p
  for p in "${phases[@]}"; do
    case $p in
      validate | lint | build | deploy | invoke) timed "sam-$p" "phase_$p" ;;
      *) die "unknown phase $p (validate, lint, build, deploy, invoke)" ;;
    esac
  done
}

main "$@"
