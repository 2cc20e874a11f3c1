#!/usr/bin/env bash
# The test command: start the local stack, load .env, run the workspace tests.
#   scripts/test.sh [extra cargo test args...]
set -euo pipefail
LOG_TAG="test"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$ROOT"

timed stack bash scripts/stack.sh up
load_dev_env
rc=0
timed cargo-test cargo test --workspace --locked "$@" || rc=$?
exit "$rc"
