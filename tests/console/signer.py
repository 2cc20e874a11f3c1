"""The keys behind the console test's browser wallet (console.test.mjs).

    python signer.py        (the project venv's, which has eth-account)

Holds the local chain's shared lock for as long as it runs, then answers one
JSON request per line on stdin with one JSON line on stdout:

    {"op": "sign", "key": "payer" | "<hex key>", "typed": {EIP-712 document}}
        -> {"signature": "0x…"}        eth-account's sign_typed_data
    {"op": "account"}
        -> {"key": "0x…", "address": "0x…"}   a fresh key, holding nothing

"payer" is anvil's account 2 of its development mnemonic, which the stack
funds and which no other test pays from, so its balance moves only by what
this test pays.

The lock is the chain harness's (shared/tests/common/chain.rs): a flock on
files in the temp directory named after the chain's RPC address, taken
shared through a writer-first turnstile, so a test that pauses mining waits
until this one is done instead of stalling its payments midway. It is
released when this process exits, however it exits.
"""

import fcntl
import json
import os
import re
import sys
import urllib.request

from eth_account import Account

MNEMONIC = "test test test test test test test test test test test junk"
RPC = os.environ.get("REEVE_CHAIN_RPC_URL", "http://127.0.0.1:8545")
BLOCK_SECONDS = 1


def lock(role, mode):
    chain = re.sub(r"[^A-Za-z0-9]", "_", RPC)
    path = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"reeve-chain-{chain}.{role}.lock")
    f = open(path, "a+")
    fcntl.flock(f, mode)
    return f


def rpc(method, params):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    req = urllib.request.Request(RPC, body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as answer:
        return json.load(answer).get("result")


def main():
    turnstile = lock("turnstile", fcntl.LOCK_EX)
    held = lock("chain", fcntl.LOCK_SH)
    turnstile.close()
    # Nobody holds the chain exclusive now, so it must be mining; a holder
    # killed before it restored mining would have left it paused.
    if rpc("anvil_getIntervalMining", []) != BLOCK_SECONDS:
        rpc("evm_setIntervalMining", [BLOCK_SECONDS])

    Account.enable_unaudited_hdwallet_features()
    payer = Account.from_mnemonic(MNEMONIC, account_path="m/44'/60'/0'/0/2")
    print(json.dumps({"ready": True, "payer": payer.address}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "sign":
                key = payer.key if request["key"] == "payer" else request["key"]
                signed = Account.sign_typed_data(key, full_message=request["typed"])
                answer = {"signature": "0x" + signed.signature.hex().removeprefix("0x")}
            elif request["op"] == "account":
                fresh = Account.create()
                answer = {"key": "0x" + fresh.key.hex().removeprefix("0x"), "address": fresh.address}
            else:
                answer = {"error": f"unknown op {request['op']!r}"}
        except Exception as e:  # the test reads the reason
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)
    held.close()


if __name__ == "__main__":
    main()
