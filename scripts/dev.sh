#!/usr/bin/env bash
# Run Reeve locally: start the stack, load .env, migrate, then serve.
#   scripts/dev.sh [serve args, e.g. --bind 127.0.0.1:8080]
set -euo pipefail
LOG_TAG="dev"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$ROOT"

bash scripts/stack.sh up
load_dev_env
cargo run --locked -p reeve-cli --bin reeve -- migrate
exec cargo run --locked -p reeve-cli --bin reeve -- serve "$@"
