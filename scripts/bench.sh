#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md, in one command, on a release build
# against the local stack (scripts/stack.sh up), loopback only:
#
#   scripts/bench.sh [worker|service|fairness|taskcreate|coldstart|fanout|auth ...]   (default: all seven)
#   scripts/bench.sh --stitch    (rewrite BENCHMARKS.md from the last run)
#
# Builds what the phases asked for with the release profile, each binary in
# a cargo invocation of its own (only its own features): the harness
# (bench/), `reeve` (worker, service), the relay (fanout), every Lambda
# function (the worker twice, with and without its `lambda` feature; then
# all of them once more together, as `sam build` links them) and
# the hello-world baseline (bench/hello) (coldstart); then runs the harness, which makes its own
# database, redis-server and SQS queue for each measurement, spreads its
# clients over loopback source addresses, raises the open-file limit
# itself, and prints one Markdown section per benchmark. BENCHMARKS.md is
# rewritten with the sections, the machine, and bench/NOTES.md (what the
# figures mean, written by hand). Each section says when, at which commit
# and by which command it was measured; a run of some phases keeps the other
# phases' sections as BENCHMARKS.md has them (between its `<!-- bench: … -->`
# markers). The sections are kept in target/bench/, so `--stitch` can take
# in an edited NOTES.md without measuring again.
# Bounded in time: once built, a full run takes about 8 minutes on 2 cores
# (fan-out and its ceiling are most of it); the release builds from cold, ~30.
# BENCH_CEILING=<watchers> moves the ceiling attempt (0 skips it). `worker` also
# times a metered task's run-start check (its one Multicall3 read) on the
# stack's anvil (REEVE_CHAIN_RPC_URL), beside a plain JSON-RPC round trip.
set -euo pipefail
LOG_TAG="bench"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$ROOT"
if [[ -f "$ENV_FILE" ]]; then
  load_dev_env
else
  [[ -n "${DATABASE_URL:-}" ]] || die "$ENV_FILE is missing and DATABASE_URL is unset; run scripts/stack.sh up"
fi
command -v redis-server >/dev/null || die "redis-server is missing (scripts/stack.sh installs it)"

all_phases=(worker service paid fairness taskcreate coldstart fanout auth)
SECTIONS="$ROOT/target/bench"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"

# BENCHMARKS.md from the saved sections (in the order of all_phases) and
# bench/NOTES.md.
stitch() {
  [[ -f "$SECTIONS/header" ]] || die "no saved run in $SECTIONS; run scripts/bench.sh first"
  {
    echo "# Benchmarks"
    echo
    cat "$SECTIONS/header"
    echo "Each section says when and at which commit it was measured. The machine is shared and noisy: read the ratios and medians measured side by side, not single absolute times."
    echo
    for phase in "${all_phases[@]}"; do
      if [[ -f "$SECTIONS/$phase.md" ]]; then
        echo "<!-- bench: $phase -->"
        cat "$SECTIONS/$phase.md"
        echo "<!-- /bench: $phase -->"
      fi
    done
    if [[ -f bench/NOTES.md ]]; then cat bench/NOTES.md; fi
  } >BENCHMARKS.md
  log "wrote BENCHMARKS.md"
}

if [[ "${1:-}" == "--stitch" ]]; then
  stitch
  exit 0
fi

phases=("$@")
[[ ${#phases[@]} -gt 0 ]] || phases=("${all_phases[@]}")
for phase in "${phases[@]}"; do
  [[ " ${all_phases[*]} " == *" $phase "* ]] || die "unknown benchmark '$phase' (${all_phases[*]})"
done

export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"
needs() { [[ " ${phases[*]} " == *" $1 "* ]]; }
# One cargo invocation per binary: cargo unifies the features of every
# package it builds at once, so a binary built beside another would link the
# other's features too. Alone, each gets what `sam build` (or `cargo build
# -p`) gives it.
build_each() {
  local p dir
  cargo build --release --locked -p reeve-bench || return
  if needs worker || needs service || needs paid || needs fairness; then cargo build --release --locked -p reeve-cli || return; fi
  if needs fanout; then cargo build --release --locked -p reeve-fn-relay || return; fi
  if needs coldstart; then
    cargo build --release --locked -p reeve-bench-hello || return
    # The worker without its default `lambda` feature (no Lambda Invoke
    # client), kept aside before the worker as the template deploys it
    # (default features, built below) takes its name.
    cargo build --release --locked -p reeve-fn-worker --no-default-features || return
    cp "$BIN/worker" "$BIN/worker-no-lambda"
    # Every Lambda under functions/ (the relay is the Fargate service).
    local bins=()
    for dir in functions/*/; do
      p="reeve-fn-$(basename "$dir")"
      [[ $p == reeve-fn-relay ]] && continue
      cargo build --release --locked -p "$p" || return
      bins+=(--bin "$(basename "$dir")")
    done
    # And as `sam build` builds them (its cargo lambda runs this for each at
    # the workspace root, so with every member's features unified), under
    # the target triple's own directory, measured in a second table.
    cargo build --release --locked --target "$LAMBDA_TARGET" "${bins[@]}" || return
  fi
}
timed build build_each

# The phases this run measures start afresh; the others keep the section
# BENCHMARKS.md has for them, with the date and commit they were measured at.
mkdir -p "$SECTIONS"
for phase in "${all_phases[@]}"; do
  rm -f "$SECTIONS/$phase.md"
  if ! needs "$phase" && [[ -f BENCHMARKS.md ]]; then
    awk -v p="$phase" '$0 == "<!-- /bench: " p " -->" { on = 0 } on { print } $0 == "<!-- bench: " p " -->" { on = 1 }' \
      BENCHMARKS.md >"$SECTIONS/$phase.md"
    [[ -s "$SECTIONS/$phase.md" ]] || rm -f "$SECTIONS/$phase.md"
  fi
done
measured="Measured by \`scripts/bench.sh ${phases[*]}\` on $(date -u +%Y-%m-%d) at commit \`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\` — release build, local stack, loopback only."
for phase in "${phases[@]}"; do
  section="$SECTIONS/$phase.md.partial"
  case "$phase" in
    fanout)     timed fanout "$BIN/reeve-bench" fanout --relay "$BIN/relay" --ceiling "${BENCH_CEILING:-50000}" >"$section" ;;
    auth)       timed auth "$BIN/reeve-bench" auth >"$section" ;;
    taskcreate) timed taskcreate "$BIN/reeve-bench" taskcreate >"$section" ;;
    worker)     timed worker "$BIN/reeve-bench" worker --reeve "$BIN/reeve" >"$section" ;;
    service)    timed service "$BIN/reeve-bench" service --reeve "$BIN/reeve" >"$section" ;;
    paid)       timed paid "$BIN/reeve-bench" paid --reeve "$BIN/reeve" >"$section" ;;
    fairness)   timed fairness "$BIN/reeve-bench" fairness --reeve "$BIN/reeve" >"$section" ;;
    coldstart)  timed coldstart "$BIN/reeve-bench" coldstart --bin-dir "$BIN" \
                  --deployed-dir "${CARGO_TARGET_DIR:-$ROOT/target}/$LAMBDA_TARGET/release" >"$section" ;;
  esac
  printf '%s\n\n' "$measured" >>"$section"
  mv "$section" "$SECTIONS/$phase.md"
done
echo "Machine of the last run: $("$BIN/reeve-bench" machine 2>/dev/null || uname -m), $(uname -sr)." >"$SECTIONS/header"
stitch
