#!/usr/bin/env bash
# The local x402 payment stack, bound to 127.0.0.1 only.
#
#   scripts/payments.sh up       install (npm ci), start anvil, place the contracts
#                                on it, fund accounts 1-9, start the facilitator
#   scripts/payments.sh status   print the table; exit 1 if anything is down
#   scripts/payments.sh down     stop what this script started
#
# Parts (npm packages pinned in scripts/payments/package-lock.json):
#   chain        127.0.0.1:8545  anvil 1.7.1 (@foundry-rs/anvil-linux-amd64), chain id
#                                84532, so reeve.dev.toml's `eip155:84532` asset is this one
#                                (never 31337: Permit2's shipped code was built there and would
#                                keep that chain's EIP-712 domain). Hardfork Prague: the upto
#                                proxy's reentrancy guard is transient storage (Cancun or later).
#                                In memory: every `up` after a `down` starts a fresh chain.
#                                A block a second, as on Base: an idle chain's clock would
#                                stand still, and clients sign validAfter = now - 600.
#   token        reeve.dev.toml's usdc-base-sepolia contract address: scripts/payments/Token.sol
#                (OpenZeppelin 5.7, compiled offline by solc-js 0.8.37), EIP-712 domain
#                "USDC"/"2", 6 decimals, with USDC's EIP-3009 transferWithAuthorization
#                (exact) and receiveWithAuthorization (batch-settlement deposits), and
#                EIP-2612 permit (upto's gas sponsoring). Accounts 1-9 of
#                anvil's development mnemonic hold 1,000 tokens each; account 0 pays the
#                facilitator's gas.
#   Permit2      0x000000000022D473030F116dDEE9F6B43aC78BA3, the runtime code Uniswap ships
#                in @uniswap/v4-periphery 1.0.3 for placing it there.
#   upto proxy   0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002 (@x402/evm's address for it):
#                scripts/payments/UptoPermit2Proxy.sol, written against @x402/evm's ABI.
#   batch        0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003 (@x402/evm's BATCH_SETTLEMENT_ADDRESS):
#   settlement   scripts/payments/BatchSettlement.sol, the batch-settlement escrow, written
#                against the ABI @x402/evm calls it with (batch-settlement-abi.json, pinned),
#                and its ERC-3009 deposit collector (ERC3009DepositCollector.sol) at
#                0x4020806089470a89826cB9fB1f4059150b550004 (ERC3009_DEPOSIT_COLLECTOR_ADDRESS).
#   Multicall3   0xcA11bde05977b3631167028862bE2a173976CA11, viem's bytecode (Multicall3
#                as deployed on every public chain): the facilitator explains a failing
#                upto payment through it, and Reeve's worker reads a metered task's
#                authorization through its aggregate3 in one round trip before the run.
#   facilitator  127.0.0.1:4021  scripts/payments/facilitator.mjs: @x402/core 2.27's
#                                facilitator with @x402/evm's exact, upto and
#                                batch-settlement schemes and the eip2612GasSponsoring
#                                extension.
#
# Reeve finds the facilitator through REEVE_FACILITATOR_URL, which this script
# adds to .env (it replaces the catalog's facilitator_url for this deployment),
# and reads the chain for lost settlements through REEVE_CHAIN_RPC_URLS
# (eip155:84532=<anvil>), added there too.
# Ports move with REEVE_STACK_CHAIN_PORT and REEVE_STACK_FACILITATOR_PORT; a
# stack on another chain port keeps its pid files and logs apart
# (.stack/payments-<port>), so it never mistakes the default one's for its own.
set -euo pipefail

LOG_TAG="payments"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

HOST=127.0.0.1
CHAIN_PORT="${REEVE_STACK_CHAIN_PORT:-8545}"
FAC_PORT="${REEVE_STACK_FACILITATOR_PORT:-4021}"
CHAIN_ID=84532
# reeve.dev.toml's [assets.usdc-base-sepolia] contract.
TOKEN_ADDRESS="${REEVE_STACK_TOKEN_ADDRESS:-0x036CbD53842c5426634e7929541eC2318f3dCF7e}"
PKG="$ROOT/scripts/payments"
if [[ $CHAIN_PORT == 8545 ]]; then DIR="$STACK_DIR/payments"; else DIR="$STACK_DIR/payments-$CHAIN_PORT"; fi
ANVIL="$PKG/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil"
RPC="http://$HOST:$CHAIN_PORT"
FAC_URL="http://$HOST:$FAC_PORT"

chain_ready() {
  curl -sf -H 'content-type: application/json' \
    -d '{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}' "$RPC" | grep -q '"0x14a34"'
}
PERMIT2_ADDRESS=0x000000000022D473030F116dDEE9F6B43aC78BA3
UPTO_PROXY_ADDRESS=0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002
BATCH_SETTLEMENT_ADDRESS=0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003
ERC3009_DEPOSIT_COLLECTOR_ADDRESS=0x4020806089470a89826cB9fB1f4059150b550004
MULTICALL3_ADDRESS=0xcA11bde05977b3631167028862bE2a173976CA11
# The facilitator answers /supported for this chain at all (it is up)...
facilitator_answers() { curl -sf "$FAC_URL/supported" | grep -q "eip155:$CHAIN_ID"; }
# ...and settles every scheme (an older one, without upto or batch-settlement,
# is not ready).
facilitator_ready() {
  local supported
  supported=$(curl -sf "$FAC_URL/supported") || return 1
  grep -q '"scheme":"exact"' <<<"$supported" && grep -q '"scheme":"upto"' <<<"$supported" &&
    grep -q '"scheme":"batch-settlement"' <<<"$supported"
}
eth_call() {
  curl -sf -H 'content-type: application/json' \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"eth_call\",\"params\":[{\"to\":\"$1\",\"data\":\"$2\"},\"latest\"]}" "$RPC"
}
# name() of the token at the catalog's address answers "USDC", nonces(0)
# answers at all (the token has EIP-2612 permit), and
# RECEIVE_WITH_AUTHORIZATION_TYPEHASH() answers ERC-3009's.
token_ready() {
  eth_call "$TOKEN_ADDRESS" 0x06fdde03 | grep -q '5553444300000000' &&
    eth_call "$TOKEN_ADDRESS" 0x7ecebe000000000000000000000000000000000000000000000000000000000000000000 | grep -q '"result":"0x0' &&
    eth_call "$TOKEN_ADDRESS" 0x7f2eecc3 | grep -q 'd099cc98ef71107a616c4f0f941f04c322d8e254fe26b3c6668db87aae413de8'
}
# Permit2's DOMAIN_SEPARATOR(), the proxy's PERMIT2() and Multicall3's
# getChainId() answer, and Multicall3's aggregate3([]) answers an empty list
# (what the worker's run-start check calls).
permit2_ready() { eth_call "$PERMIT2_ADDRESS" 0x3644e515 | grep -q '"result":"0x[0-9a-f]\{64\}"'; }
upto_proxy_ready() { eth_call "$UPTO_PROXY_ADDRESS" 0x6afdd850 | grep -qi '000000000022d473030f116ddee9f6b43ac78ba3'; }
AGGREGATE3_NONE=0x82ad56cb$(printf '%064x%064x' 32 0)
multicall3_ready() {
  eth_call "$MULTICALL3_ADDRESS" 0x3408e470 | grep -q '"result":"0x0*14a34"' &&
    eth_call "$MULTICALL3_ADDRESS" "$AGGREGATE3_NONE" | grep -q "\"result\":\"0x$(printf '%064x%064x' 32 0)\""
}
# The escrow's CHANNEL_CONFIG_TYPEHASH() answers, and the collector's
# x402BatchSettlement() names the escrow.
batch_ready() {
  eth_call "$BATCH_SETTLEMENT_ADDRESS" 0x8e4a68ac | grep -q '1c9a06ceab9b0ebbd3301dc56c9111bb6d9af421356dc9ccb3b7084c755db308' &&
    eth_call "$ERC3009_DEPOSIT_COLLECTOR_ADDRESS" 0x4dec6d95 | grep -qi "${BATCH_SETTLEMENT_ADDRESS#0x}"
}
contracts_ready() { token_ready && permit2_ready && upto_proxy_ready && batch_ready && multicall3_ready; }

ensure_npm() {
  command -v node >/dev/null && command -v npm >/dev/null || die "node and npm are needed (apt-get install nodejs npm)"
  if [[ ! -x $ANVIL || $PKG/package-lock.json -nt $PKG/node_modules/.package-lock.json ]]; then
    log "installing the pinned npm packages (npm ci in scripts/payments)"
    (cd "$PKG" && npm ci --no-audit --no-fund --loglevel=error) >&2
  fi
}

chain_start() {
  mkdir -p "$DIR"
  if live_pid "$DIR/anvil.pid" anvil >/dev/null; then
    wait_for anvil 30 "$DIR/anvil.log" chain_ready
    return 0
  fi
  port_open "$CHAIN_PORT" && die "$HOST:$CHAIN_PORT is in use by another process; stop it or set REEVE_STACK_CHAIN_PORT"
  log "starting anvil (chain id $CHAIN_ID) on $HOST:$CHAIN_PORT"
  start_bg "$DIR/anvil.pid" "$DIR/anvil.log" \
    "$ANVIL" --host "$HOST" --port "$CHAIN_PORT" --chain-id "$CHAIN_ID" --hardfork prague --block-time 1 --silent
  wait_for anvil 30 "$DIR/anvil.log" chain_ready
}

contracts_deploy() {
  contracts_ready && return 0
  log "compiling Token.sol, UptoPermit2Proxy.sol and the batch-settlement contracts (solc-js); placing them, Permit2 and Multicall3"
  node "$PKG/compile.mjs" >"$DIR/contracts.json"
  node "$PKG/deploy.mjs" "$RPC" "$TOKEN_ADDRESS" "$DIR/contracts.json" >&2
  contracts_ready || die "the contracts were placed but do not answer as expected"
}

port_closed() { ! port_open "$FAC_PORT"; }

facilitator_start() {
  local pid
  if pid=$(live_pid "$DIR/facilitator.pid" facilitator.mjs); then
    wait_for facilitator 30 "$DIR/facilitator.log" facilitator_answers
    facilitator_ready && return 0
    # Started by an older checkout of this script: not every scheme.
    log "the running facilitator does not settle every scheme; restarting it"
    stop_pid "$pid" 10
    # Its listening socket can outlive it for a moment.
    wait_for "the facilitator's port" 10 "$DIR/facilitator.log" port_closed
  fi
  port_open "$FAC_PORT" && die "$HOST:$FAC_PORT is in use by another process; stop it or set REEVE_STACK_FACILITATOR_PORT"
  log "starting the facilitator on $FAC_URL"
  start_bg "$DIR/facilitator.pid" "$DIR/facilitator.log" \
    node "$PKG/facilitator.mjs" "$RPC" "$HOST" "$FAC_PORT"
  wait_for facilitator 30 "$DIR/facilitator.log" facilitator_ready
}

status_table() {
  local down=0 pid st
  printf '%-12s %-22s %-8s %s\n' SERVICE ADDRESS PID STATE
  if pid=$(live_pid "$DIR/anvil.pid" anvil) && chain_ready; then st=up; else st=down; pid=-; down=1; fi
  printf '%-12s %-22s %-8s %s\n' chain "$RPC" "$pid" "$st (anvil, chain id $CHAIN_ID)"
  if token_ready; then st=up; else st=down; down=1; fi
  printf '%-12s %-22s %-8s %s\n' token "$TOKEN_ADDRESS" - "$st (EIP-3009 transfer and receive, EIP-2612)"
  if permit2_ready; then st=up; else st=down; down=1; fi
  printf '%-12s %-22s %-8s %s\n' permit2 "$PERMIT2_ADDRESS" - "$st"
  if upto_proxy_ready; then st=up; else st=down; down=1; fi
  printf '%-12s %-22s %-8s %s\n' upto-proxy "$UPTO_PROXY_ADDRESS" - "$st"
  if batch_ready; then st=up; else st=down; down=1; fi
  printf '%-12s %-22s %-8s %s\n' batch "$BATCH_SETTLEMENT_ADDRESS" - "$st (deposits through $ERC3009_DEPOSIT_COLLECTOR_ADDRESS)"
  if multicall3_ready; then st=up; else st=down; down=1; fi
  printf '%-12s %-22s %-8s %s\n' multicall3 "$MULTICALL3_ADDRESS" - "$st"
  if pid=$(live_pid "$DIR/facilitator.pid" facilitator.mjs) && facilitator_ready; then st=up; else st=down; pid=-; down=1; fi
  printf '%-12s %-22s %-8s %s\n' facilitator "$FAC_URL" "$pid" "$st (@x402/core: exact, upto, batch-settlement)"
  return "$down"
}

cmd_up() {
  mkdir -p "$DIR"
  exec 8>"$DIR/.lock"
  flock -w 300 8 || die "another scripts/payments.sh is still running"
  ensure_npm
  chain_start
  contracts_deploy
  facilitator_start
  # Point this checkout's .env at the local facilitator and chain (once).
  env_add REEVE_FACILITATOR_URL "$FAC_URL"
  env_add REEVE_CHAIN_RPC_URL "$RPC"
  # The network the local chain stands in for, for the payments reconciler.
  env_add REEVE_CHAIN_RPC_URLS "eip155:$CHAIN_ID=$RPC"
  status_table || die "some payment services are down"
}

cmd_down() {
  local pid
  if pid=$(live_pid "$DIR/facilitator.pid" facilitator.mjs); then log "stopping the facilitator"; stop_pid "$pid" 10; fi
  if pid=$(live_pid "$DIR/anvil.pid" anvil); then log "stopping anvil"; stop_pid "$pid" 10; fi
  return 0
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) status_table ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
