#!/usr/bin/env bash
# A property-based run of the API against its own OpenAPI document
# (schemathesis, pinned in scripts/requirements.txt): a real `reeve serve` on
# a database and a queue of this run's own, called with a real session.
#   scripts/api-fuzz.sh [extra schemathesis args]
# It must find no server error, no schema-valid request refused, and no
# answer that the document does not describe. Bounded: a fixed number of
# examples per operation (REEVE_FUZZ_EXAMPLES, default 100), a fixed seed, and
# a hard cap on the time (REEVE_FUZZ_MAX_SECONDS, default 600).
set -euo pipefail
LOG_TAG="api-fuzz"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source-path=SCRIPTDIR source=lib/isolated_serve.sh
. "$ROOT/scripts/lib/isolated_serve.sh"
cd "$ROOT"

load_dev_env
ST="${REEVE_SCHEMATHESIS:-$VENV_DIR/bin/schemathesis}"
[[ -x $ST ]] || die "schemathesis is missing: run scripts/stack.sh up (it installs scripts/requirements.txt)"
trap isolated_stop EXIT
isolated_stack_start api-fuzz
isolated_serve_start api-fuzz

space=$(curl -fsS -X POST "$REEVE_TEST_URL/v1/spaces" | sed -n 's/.*"space_id":"\([0-9]*\)".*/\1/p')
token=$(curl -fsS -X POST "$REEVE_TEST_URL/v1/sessions" -H 'content-type: application/json' \
  -d "{\"space_id\":\"$space\"}" | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
[[ -n $token ]] || die "could not open a session"
# A Space with a webhook secret, so that a task or Space `webhook` (which the
# document's examples carry) is taken and stored, not refused for the
# Space's state (`webhook_secret_required`).
curl -fsS -o /dev/null -X POST "$REEVE_TEST_URL/v1/space/webhook-secret" -H "Authorization: Bearer $token" \
  || die "could not create the Space's webhook secret"

# The session lasts 15 minutes, far longer than the run. One worker:
# hypothesis's lambda descriptions are not thread-safe, and with two the
# coverage phase sometimes dies of "AST constructor recursion depth mismatch".
# Checks:
# not_a_server_error, schema_valid_requests_are_accepted (ours: the
# built-in positive check, but knowing which refusals depend on the state
# of the Space rather than on the request's shape), and the conformance of
# every answer's status, content type, headers and body to the document.
SCHEMATHESIS_HOOKS=schemathesis_hooks PYTHONPATH="$ROOT/scripts" \
timeout "${REEVE_FUZZ_MAX_SECONDS:-600}" "$ST" run "$REEVE_TEST_URL/v1/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,schema_valid_requests_are_accepted \
  --phases examples,coverage,fuzzing \
  --max-examples "${REEVE_FUZZ_EXAMPLES:-100}" \
  --request-timeout 10 \
  --seed "${REEVE_FUZZ_SEED:-20261201}" \
  --workers 1 \
  --no-color \
  "$@"
