#!/usr/bin/env bash
# The test command: start the local stack (while the bare run's format
# check and its one build, clippy linting inside it, run), load .env, run
# the workspace tests, the
# README's cargo lambda watch loop (scripts/watch-check.sh), the
# API fuzz run (scripts/api-fuzz.sh), the browser console test
# (scripts/console-test.sh), the official MCP clients and the MCP
# conformance suite (scripts/mcp-clients.sh), and the SAM checks (scripts/sam-check.sh:
# `sam build` with the quick profile, then validate and the
# translated-template lint, in the background while the tests run; then
# cargo lambda deploy to moto and local invoke, beside the phases after the
# tests).
#   scripts/test.sh [extra cargo test args...]
# With extra arguments (a filtered run) only the cargo tests run;
# REEVE_SKIP_SAM_CHECK=1 skips the SAM checks. CI runs it without arguments.
set -euo pipefail
LOG_TAG="test"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$ROOT"

# clippy lints inside the build, not beside it: `cargo clippy` is `cargo
# check` with clippy-driver wrapping rustc for the workspace's own crates, and
# a check compiles every dependency a second time (metadata only, but most
# of the clippy phase's 341 s in a cold CI run, beside the debug build's 415).
# The same wrapper on the debug build lints
# the same crates, every warning an error, and keeps one set of dependency
# builds. Every cargo of this run inherits it (the tests, the watch phase's
# functions, the SAM check's build), so none of them rebuilds the workspace
# without it.
lint_in_build

# Built once: every cargo of this run builds for the target triple named,
# as cargo lambda does (`sam build` runs `cargo build --target
# x86_64-unknown-linux-gnu`). A build that names its target keeps its
# artifacts apart from one that does not, so the SAM check's build would
# otherwise compile every dependency a second time: 939 s of a 1751 s CI
# run, beside the tests. With the same triple, profile (scripts/sam-check.sh's
# quick profile is SAM's debug mode) and wrapper it finds this build's
# units fresh and copies the bootstraps. Lambda's x86_64 is the only
# architecture scripts/sam-check.sh runs.
[[ $(uname -m) == x86_64 ]] || die "scripts/test.sh runs on x86_64 only (the SAM check invokes x86_64 Lambda functions)"
export CARGO_BUILD_TARGET=$LAMBDA_TARGET

# `cargo test` runs its test binaries one after another, and most of their
# time is waiting (a block a second, leases, the queue's long polls): the
# shared crate's suite alone is ~400 s of a ~550 s phase. So the binaries the
# build made run here in two lanes side by side, that suite in one and every
# other binary, then the doc tests, in the other, each binary from its
# package's directory as cargo runs it. (Selecting them with `cargo test -p`
# would resolve other features and rebuild; three packages name their
# integration suite `suite`, so `--test` cannot pick the one either.)
run_test_binaries() {
  local list line dir name exe suite="" others=() suite_log suite_pid suite_rc=0 lane_rc=0 shared
  shared=$(cd "$ROOT/shared" && pwd -P)
  list=$(cargo test --workspace --locked --no-run --message-format=json-render-diagnostics |
    python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(os.path.dirname(m["manifest_path"]), m["target"]["name"], m["executable"], sep="\t")') || return
  while IFS=$'\t' read -r dir name exe; do
    if [[ $dir == "$shared" && $name == suite ]]; then suite="$dir"$'\t'"$exe"; else others+=("$dir"$'\t'"$exe"); fi
  done <<<"$list"
  [[ -n $suite ]] || { log "no shared test suite among the built test binaries"; return 1; }
  suite_log=$(mktemp)
  (cd "${suite%%$'\t'*}" && exec "${suite#*$'\t'}") >"$suite_log" 2>&1 &
  suite_pid=$!
  for line in "${others[@]}"; do
    log "running ${line#*$'\t'}"
    (cd "${line%%$'\t'*}" && exec "${line#*$'\t'}") || lane_rc=$?
  done
  cargo test --workspace --locked --no-fail-fast --doc || lane_rc=$?
  wait "$suite_pid" || suite_rc=$?
  log "running ${suite#*$'\t'} (beside the others)"
  cat "$suite_log"
  rm -f "$suite_log"
  ((suite_rc == 0)) || return "$suite_rc"
  return "$lane_rc"
}

rc=0
if (($# == 0)); then
  # The lint gates and the build, on a bare run (CI's): formatting as
  # rustfmt.toml says, then one debug build of every target (the test
  # binaries, and the function binaries that the watch phase's `cargo run
  # --bin <function>` finds built: Cargo.toml's strsim note says why they are
  # the same units), clippy in it. They need no stack, and the stack's set-up
  # is mostly downloads, so it comes up in the background meanwhile (its
  # output follows, once it is up).
  stack_log=$(mktemp)
  (REEVE_STACK_BROWSER=1 timed stack bash scripts/stack.sh up) >"$stack_log" 2>&1 &
  stack_pid=$!
  timed fmt cargo fmt --all --check || rc=$?
  timed cargo-build cargo build --workspace --all-targets --locked || { r=$?; ((rc)) || rc=$r; }
  # The phases below drive this build's `reeve`. Built alone (`-p
  # reeve-cli`, as console-test.sh does when run by itself) it unifies other
  # features, so cargo rebuilt reeve-shared and its dependencies: 10 of the
  # console phase's 11 minutes in a cold run.
  export REEVE_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/$CARGO_BUILD_TARGET/debug/reeve"
  stack_rc=0
  wait "$stack_pid" || stack_rc=$?
  cat "$stack_log" >&2
  rm -f "$stack_log"
  ((stack_rc == 0)) || die "the local stack did not come up (exit $stack_rc)"
else
  REEVE_STACK_BROWSER=1 timed stack bash scripts/stack.sh up
fi
load_dev_env
sam_check=0
if (($# == 0)) && [[ ${REEVE_SKIP_SAM_CHECK:-0} != 1 ]]; then sam_check=1; fi
if ((sam_check)); then
  # The SAM checks' build (`sam build` of every function with the quick
  # profile, see scripts/sam-check.sh) is the debug build above, found
  # fresh: seconds, so it runs here, before the tests, which it must not
  # run beside (cargo lambda moves each function's binary out of the build
  # directory, where the tests run some of them; sam-check.sh links them
  # back). Then validate and lint (CPU, no bootstraps needed) run while the
  # tests run: at nice 19 they take only the CPU the tests leave idle (they
  # mostly wait on the chain, the queue and the browser). The second half
  # (cargo lambda deploy to moto, and sam local invoke of every function)
  # waits for the cargo tests to end ($sam_go), whose timing bounds a busy
  # machine would stretch; it then runs beside the phases that drive `reeve
  # serve` from outside (the invokes mostly wait on Docker).
  sam_log=$(mktemp)
  sam_go=$(mktemp -u)
  sam_build_rc=0
  SAM_CHECK_PROFILE=quick timed sam-check-build bash scripts/sam-check.sh build || sam_build_rc=$?
  (if ((sam_build_rc)); then exit "$sam_build_rc"; fi
   timed sam-check-rules nice -n 19 bash scripts/sam-check.sh validate lint &
   rules_pid=$!
   while [[ ! -e $sam_go ]]; do sleep 1; done
   invoke_rc=0 rules_rc=0
   timed sam-check-invoke bash scripts/sam-check.sh deploy invoke || invoke_rc=$?
   wait "$rules_pid" || rules_rc=$?
   ((invoke_rc)) && exit "$invoke_rc"
   exit "$rules_rc") >"$sam_log" 2>&1 &
  sam_pid=$!
fi
# Six tests at a time, not one per core: the suites mostly wait (a block
# a second, leases, the queue's long polls), so on two cores this cut the
# shared suite from 566 s to 406 s in one measurement, with no test slower
# past its own bounds. The chain tests coordinate through their own locks
# (shared/tests/common/chain.rs), whatever the thread count.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-6}
if (($# == 0)); then
  timed cargo-test run_test_binaries || { r=$?; ((rc)) || rc=$r; }
else
  timed cargo-test cargo test --workspace --locked --no-fail-fast "$@" || { r=$?; ((rc)) || rc=$r; }
fi
if ((sam_check)); then touch "$sam_go"; fi
# The README's `cargo lambda watch` loop, on the functions the build above
# made; then phases that drive a real `reeve serve` from outside, each on a
# database and a queue of its own: schemathesis against the OpenAPI
# document, the browser console in headless Chromium, and the official MCP
# clients (the TypeScript SDK paying with x402) and conformance suite.
if (($# == 0)); then
  timed watch bash scripts/watch-check.sh || { r=$?; ((rc)) || rc=$r; }
  timed api-fuzz bash scripts/api-fuzz.sh || { r=$?; ((rc)) || rc=$r; }
  timed console bash scripts/console-test.sh || { r=$?; ((rc)) || rc=$r; }
  timed mcp-clients bash scripts/mcp-clients.sh || { r=$?; ((rc)) || rc=$r; }
fi
if ((sam_check)); then
  sam_rc=0
  wait "$sam_pid" || sam_rc=$?
  cat "$sam_log" >&2
  rm -f "$sam_log" "$sam_go"
  ((rc)) || rc=$sam_rc
else
  log "skipping scripts/sam-check.sh (filtered run or REEVE_SKIP_SAM_CHECK=1)"
fi
if ((rc)); then
  # What the stack said while the tests failed: a service's errors (an S3
  # write refused as InternalError, say) are in its log, which a CI run
  # leaves on a machine nobody can read afterwards; and disk, since
  # SeaweedFS turns its volumes read-only when the disk is nearly full.
  log "the run failed (exit $rc); the disk and the services' last warnings follow"
  df -h "$ROOT" >&2 || true
  for f in "$STACK_DIR"/*/*.log; do
    [[ -f $f ]] || continue
    errs=$(grep -E '^[EWF][0-9]{4} |ERROR|FATAL|PANIC' "$f" | tail -n 15) || true
    if [[ -n $errs ]]; then printf '%s\n%s\n' "--- ${f#"$ROOT"/}" "$errs" >&2; fi
  done
fi
exit "$rc"
