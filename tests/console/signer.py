"""The keys behind the console test's browser wallet (console.test.mjs).

    python signer.py        (the project venv's, which has eth-account)

Holds the local chain's shared lock for as long as it runs, then answers one
JSON request per line on stdin with one JSON line on stdout:

    {"op": "sign", "key": "payer" | "<hex key>", "typed": {EIP-712 document}}
        -> {"signature": "0x…"}        eth-account's sign_typed_data
    {"op": "account"}
        -> {"key": "0x…", "address": "0x…"}   a fresh key, holding nothing
    {"op": "fund", "address": "0x…", "amount": "<atomic units>"}
        -> {"funded": "0x<transaction>"}   test USDC minted to it, mined
    {"op": "pause"}
        -> {"paused": true}   the chain held exclusive, mining stopped
    {"op": "resume"}
        -> {"paused": false}  a block mined, mining again, the chain shared

"payer" is anvil's account 2 of its development mnemonic, which the stack
funds and which no other test pays from, so its balance moves only by what
this test pays.

The lock is the chain harness's (shared/tests/common/chain.rs): a flock on
files in the temp directory named after the chain's RPC address, taken
shared through a writer-first turnstile, so a test that pauses mining waits
until this one is done instead of stalling its payments midway. To pause
mining itself, it trades its shared hold for the exclusive one, and back.
It is released when this process exits, however it exits, and mining is
restored first if this process stopped it.

Funding mints as the chain harness does: from anvil's account 9 (unlocked),
which the test token lets mint, one send at a time machine-wide (its "mint"
lock), since anvil numbers the minter's transactions from its pending count.
"""

import fcntl
import json
import os
import re
import sys
import time
import urllib.request

from eth_account import Account

MNEMONIC = "test test test test test test test test test test test junk"
RPC = os.environ.get("REEVE_CHAIN_RPC_URL", "http://127.0.0.1:8545")
BLOCK_SECONDS = 1
# The local chain's test USDC, and anvil's account 9, which mints it.
TOKEN = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
MINTER = "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720"
MINT = "0x40c10f19"  # mint(address,uint256)


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
        answer = json.load(answer)
    if "error" in answer:
        raise RuntimeError(f"{method}: {answer['error']}")
    return answer.get("result")


def fund(address, amount):
    """Mints `amount` of the test token to `address`; returns once mined."""
    data = MINT + address[2:].lower().rjust(64, "0") + format(int(amount), "064x")
    with lock("mint", fcntl.LOCK_EX):
        tx = rpc("eth_sendTransaction", [{"from": MINTER, "to": TOKEN, "data": data}])
    for _ in range(100):
        receipt = rpc("eth_getTransactionReceipt", [tx])
        if receipt:
            if receipt["status"] != "0x1":
                raise RuntimeError(f"the mint {tx} failed")
            return tx
        time.sleep(0.1)
    raise RuntimeError(f"the mint {tx} was not mined in 10 s")


def hold(mode):
    """The chain lock in `mode`, through the turnstile."""
    turnstile = lock("turnstile", fcntl.LOCK_EX)
    held = lock("chain", mode)
    turnstile.close()
    return held


def mining():
    rpc("evm_setIntervalMining", [BLOCK_SECONDS])


def main():
    chain = {"lock": hold(fcntl.LOCK_SH), "paused": False}
    # Nobody holds the chain exclusive now, so it must be mining; a holder
    # killed before it restored mining would have left it paused.
    if rpc("anvil_getIntervalMining", []) != BLOCK_SECONDS:
        mining()
    try:
        answer_requests(chain)
    finally:
        if chain["paused"]:
            mining()
        chain["lock"].close()


def answer_requests(chain):
    Account.enable_unaudited_hdwallet_features()
    payer = Account.from_mnemonic(MNEMONIC, account_path="m/44'/60'/0'/0/2")
    print(json.dumps({"ready": True, "payer": payer.address}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = answer_one(chain, payer, request)
        except Exception as e:  # the test reads the reason
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


def answer_one(chain, payer, request):
    op = request["op"]
    if op == "sign":
        key = payer.key if request["key"] == "payer" else request["key"]
        signed = Account.sign_typed_data(key, full_message=request["typed"])
        return {"signature": "0x" + signed.signature.hex().removeprefix("0x")}
    if op == "account":
        fresh = Account.create()
        return {"key": "0x" + fresh.key.hex().removeprefix("0x"), "address": fresh.address}
    if op == "fund":
        return {"funded": fund(request["address"], request["amount"])}
    if op == "pause" and not chain["paused"]:
        # Shared for exclusive: never both, or it would wait for itself.
        chain["lock"].close()
        chain["lock"] = hold(fcntl.LOCK_EX)
        chain["paused"] = True
        rpc("evm_setIntervalMining", [0])
        rpc("evm_setAutomine", [False])
        return {"paused": True}
    if op == "resume" and chain["paused"]:
        rpc("evm_mine", [])
        mining()
        chain["paused"] = False
        chain["lock"].close()
        chain["lock"] = hold(fcntl.LOCK_SH)
        return {"paused": False}
    return {"error": f"cannot {op!r} now"}


if __name__ == "__main__":
    main()
