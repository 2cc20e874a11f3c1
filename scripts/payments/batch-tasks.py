"""The official batch-settlement buyer in Python paying Reeve's REST create.

    REEVE_WALLET_KEY=0x… python batch-tasks.py <rpc url> <create url> <session token> <count> <label>

The twin of batch-tasks.mjs, with coinbase's x402 Python SDK: its sync HTTP
client (x402HTTPClientSync) over its batch-settlement client
(BatchSettlementEvmScheme), creating <count> tasks of one kind over the payer's
one channel to Reeve, as the SDK's own transports pay (PaymentRoundTripper):
ask, get the 402, pay, and after a corrective 402 (the client's count of its
channel is behind) resynchronise from it and pay once more. Everything the
protocol does is the SDK's: the channel's config and id, the deposit's size
(the offer's minDeposit), its ERC-3009 authorization to the deposit collector,
the vouchers, the channel state kept from each PAYMENT-RESPONSE, and the
resynchronisation. The first payment of a new channel is a deposit (the
facilitator sends it and pays the gas), every later one a voucher Reeve checks
itself. The client reads the escrow at <rpc url> for a channel it has no state
of (a new process paying on an old channel), as it does for a corrective 402.
Spend controls are off: the local token is not one of the SDK's known assets.

Task i's input is {"n": "<label>-<i>"}. Prints JSON, one entry per task: the
create's status and task id (or error code), the payload type paid with,
whether the client resynchronised, the PAYMENT-SIGNATURE it sent last (a test
sends it again) and the paid round trip in ms; on stderr, a line per payment
sent (its type and the answer's status). The key comes from the environment,
never from an argument.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

from eth_account import Account
from x402 import x402ClientSync
from x402.http import x402HTTPClientSync
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC

USAGE = "usage: REEVE_WALLET_KEY=0x… python batch-tasks.py <rpc url> <create url> <session token> <count> <label>"


def post(url: str, token: str, body: bytes, extra: dict[str, str]):
    """POSTs `body`; answers (status, headers, body), whatever the status."""
    headers = {"content-type": "application/json", "authorization": f"Bearer {token}", **extra}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as answer:
        return answer.code, answer.headers, answer.read()


def paid(client: x402HTTPClientSync, required, url: str, token: str, body: bytes, i: int):
    """Pays `required` with the SDK's next payload; answers the payload, the
    header sent and the answer. Says on stderr what it sent and what came
    back, so a run that fails shows how far it got."""
    payload = client.create_payment_payload(required)
    signature = client.encode_payment_signature_header(payload)
    status, headers, text = post(url, token, body, signature)
    print(f"task {i}: a {payload.payload['type']} payment, answered {status}", file=sys.stderr)
    return payload, signature, (status, headers, text)


def create(client: x402HTTPClientSync, url: str, token: str, label: str, i: int) -> dict:
    """One create, paid."""
    body = json.dumps({"input": {"n": f"{label}-{i}"}}).encode()
    status, headers, text = post(url, token, body, {})
    if status != 402:
        raise RuntimeError(f"expected 402, got {status}: {text.decode(errors='replace')}")
    required = client.get_payment_required_response(headers.get, json.loads(text))
    started = time.perf_counter()
    payload, signature, (status, headers, text) = paid(client, required, url, token, body, i)
    recovered = client.process_payment_result(payload, headers.get, status).recovered
    if recovered:
        payload, signature, (status, headers, text) = paid(client, required, url, token, body, i)
        client.process_payment_result(payload, headers.get, status)
    ms = round((time.perf_counter() - started) * 1000, 1)
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {}
    error = answer.get("error")
    created = {
        "status": status,
        "id": answer.get("id"),
        "code": error.get("code") if isinstance(error, dict) else None,
        "type": payload.payload["type"],
        "recovered": recovered,
        "header": next(iter(signature.values())),
        "ms": ms,
    }
    # The shape batch-tasks.mjs prints: absent fields are left out.
    return {name: value for name, value in created.items() if value is not None}


def main() -> int:
    args = sys.argv[1:]
    key = os.environ.get("REEVE_WALLET_KEY")
    if not key or len(args) != 5:
        print(USAGE, file=sys.stderr)
        return 2
    rpc, url, token, count, label = args
    payer = EthAccountSignerWithRPC(Account.from_key(key), rpc)
    sdk = x402ClientSync().set_spend_controls(False).register("eip155:*", BatchSettlementEvmScheme(payer))
    client = x402HTTPClientSync(sdk)
    created = [create(client, url, token, label, i) for i in range(int(count))]
    print(json.dumps(created))
    return 0


if __name__ == "__main__":
    sys.exit(main())
