#!/usr/bin/env bash
# The test command: start the local stack, load .env, check formatting and
# clippy (bare runs), run the workspace tests,
# the API fuzz run (scripts/api-fuzz.sh), the browser console test
# (scripts/console-test.sh), then the SAM checks (scripts/sam-check.sh:
# validate, the translated-template lint, build, cargo lambda deploy to moto,
# local invoke).
#   scripts/test.sh [extra cargo test args...]
# With extra arguments (a filtered run) only the cargo tests run;
# REEVE_SKIP_SAM_CHECK=1 skips the SAM checks. CI runs it without arguments.
set -euo pipefail
LOG_TAG="test"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$ROOT"

# Each function crate alone, with only its own reeve-shared features.
clippy_each_function() {
  local dir status=0
  for dir in functions/*/; do
    cargo clippy --locked -p "reeve-fn-$(basename "$dir")" -- -D warnings || status=1
  done
  return "$status"
}

REEVE_STACK_BROWSER=1 timed stack bash scripts/stack.sh up
load_dev_env
rc=0
# The lint gates, on a bare run (CI's): formatting as rustfmt.toml says, and
# clippy with every warning an error.
if (($# == 0)); then
  timed fmt cargo fmt --all --check || rc=$?
  timed clippy cargo clippy --workspace --all-targets --locked -- -D warnings || { r=$?; ((rc)) || rc=$r; }
  # The workspace build unifies every crate's features; `sam build` builds
  # each function with its own alone, so each must be clean on its own too.
  timed clippy-functions clippy_each_function || { r=$?; ((rc)) || rc=$r; }
fi
timed cargo-test cargo test --workspace --locked "$@" || { r=$?; ((rc)) || rc=$r; }
# Phases that drive a real `reeve serve` from outside, each on a database and
# a queue of its own: schemathesis against the OpenAPI document, and the
# browser console in headless Chromium.
if (($# == 0)); then
  timed api-fuzz bash scripts/api-fuzz.sh || { r=$?; ((rc)) || rc=$r; }
  timed console bash scripts/console-test.sh || { r=$?; ((rc)) || rc=$r; }
fi
if (($# == 0)) && [[ ${REEVE_SKIP_SAM_CHECK:-0} != 1 ]]; then
  timed sam-check bash scripts/sam-check.sh || { r=$?; ((rc)) || rc=$r; }
else
  log "skipping scripts/sam-check.sh (filtered run or REEVE_SKIP_SAM_CHECK=1)"
fi
exit "$rc"
