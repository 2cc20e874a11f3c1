#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md, in one command, on a release build
# against the local stack (scripts/stack.sh up), loopback only:
#
#   scripts/bench.sh [fanout|auth|coldstart ...]   (default: all three)
#
# Builds the relay, the seven function binaries and the harness (bench/)
# with the release profile, then runs the harness, which makes its own
# database and its own redis-server for each measurement, raises the
# open-file limit itself, and prints one Markdown section per benchmark.
# BENCHMARKS.md is rewritten with the sections, the command and the machine.
# Bounded in time: a full run takes about a quarter of an hour on 2 cores.
# BENCH_CEILING=<watchers> moves the ceiling attempt (0 skips it).
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

phases=("$@")
[[ ${#phases[@]} -gt 0 ]] || phases=(fanout auth coldstart)

export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"
functions=(-p reeve-fn-auth -p reeve-fn-catalog -p reeve-fn-presign -p reeve-fn-task-create
           -p reeve-fn-task-status -p reeve-fn-upload-guard -p reeve-fn-worker)
timed build cargo build --release --locked -p reeve-bench -p reeve-fn-relay "${functions[@]}"

BIN="$ROOT/target/release"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for phase in "${phases[@]}"; do
  case "$phase" in
    fanout)    timed fanout "$BIN/reeve-bench" fanout --relay "$BIN/relay" --ceiling "${BENCH_CEILING:-50000}" >>"$out" ;;
    auth)      timed auth "$BIN/reeve-bench" auth >>"$out" ;;
    coldstart) timed coldstart "$BIN/reeve-bench" coldstart --bin-dir "$BIN" >>"$out" ;;
    *) die "unknown benchmark '$phase' (fanout, auth, coldstart)" ;;
  esac
done

{
  echo "# Benchmarks"
  echo
  echo "Written by \`scripts/bench.sh ${phases[*]}\` on $(date -u +%Y-%m-%d) — release build, local stack, loopback only."
  echo "Machine: $("$BIN/reeve-bench" machine 2>/dev/null || uname -m), $(uname -sr)."
  echo "The machine is shared and noisy: read the ratios and medians measured side by side, not single absolute times."
  echo
  cat "$out"
  if [[ -f bench/NOTES.md ]]; then cat bench/NOTES.md; fi
} >BENCHMARKS.md
log "wrote BENCHMARKS.md"
