#!/usr/bin/env bash
# The browser console in headless Chromium (tests/console/console.test.mjs):
# a real page on a real `reeve serve`, `reeve relay` and `reeve work`, on a
# database and a queue of this run's own, paying on the local chain through a
# facilitator of its own. Needs the stack up (with scripts/payments.sh's
# chain), Debian's chromium, node and the project venv (eth-account).
#   scripts/console-test.sh
# REEVE_CONSOLE_SCREENSHOTS=1 saves the main states as docs/console-*.png.
# Then tests/console/bundle.test.mjs rebuilds the page's vendored noble
# bundle from the pinned packages and checks it byte for byte.
set -euo pipefail
LOG_TAG="console-test"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source-path=SCRIPTDIR source=lib/isolated_serve.sh
. "$ROOT/scripts/lib/isolated_serve.sh"
cd "$ROOT"

command -v node >/dev/null || die "node is missing: apt-get install nodejs npm"
[[ -x ${REEVE_CHROMIUM:-/usr/bin/chromium} ]] || die "chromium is missing: apt-get install chromium"
# The wordfreq check serves examples/wordfreq with `cargo lambda watch`.
command -v cargo-lambda >/dev/null || die "cargo-lambda is missing: scripts/stack.sh up installs it"
load_dev_env
# The page is compiled into the binary (include_str!): build it, so the test
# never drives an older page than the working tree's.
[[ -n ${REEVE_BIN:-} ]] || cargo build --locked -q -p reeve-cli --bin reeve || die "cannot build reeve"
bash scripts/payments.sh status >/dev/null || die "the local payment stack is down: scripts/payments.sh up"
# The lockfile pins playwright-core (it drives Debian's Chromium and never
# downloads a browser of its own), and the noble packages and esbuild the
# bundle check rebuilds with.
(cd tests/console && npm ci --no-audit --no-fund --loglevel=error)
trap isolated_stop EXIT
isolated_stack_start console
(cd tests/console && node --test --test-reporter=spec console.test.mjs bundle.test.mjs)
