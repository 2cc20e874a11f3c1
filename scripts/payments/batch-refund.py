"""The official batch-settlement buyer in Python asking Reeve for a cooperative refund.

    REEVE_WALLET_KEY=0x… python batch-refund.py <rpc url> <refund url> [amount]

The twin of batch-refund.mjs, with coinbase's x402 Python SDK: its
batch-settlement client's `refund(url)`, unchanged. It asks <refund url> with
GET, reads the batch-settlement offer from the 402, and asks again with a
`refund` payload (a voucher of what the channel was charged); after a
corrective 402 (its count of the channel is behind, as it is in a new process)
it resynchronises from it and asks once more. The client reads the escrow at
<rpc url> for a channel it has no state of. The requests go through the
SDK's `fetch` hook, over the standard library, watched.

Prints JSON: the settle response it returned (`settled`) or the error it
raised (`error`), the PAYMENT-SIGNATURE it sent last (`header`: a test sends
it again) and each answer's status (`statuses`). The key comes from the
environment, never from an argument.
"""

import json
import os
import sys
import urllib.error
import urllib.request

from eth_account import Account
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
from x402.mechanisms.evm.batch_settlement.client.refund import RefundOptions, _RefundResponse
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC

USAGE = "usage: REEVE_WALLET_KEY=0x… python batch-refund.py <rpc url> <refund url> [amount]"


def main() -> int:
    key = os.environ.get("REEVE_WALLET_KEY")
    if not key or len(sys.argv) not in (3, 4):
        print(USAGE, file=sys.stderr)
        return 2
    rpc, url = sys.argv[1], sys.argv[2]
    amount = sys.argv[3] if len(sys.argv) == 4 else None
    client = BatchSettlementEvmScheme(EthAccountSignerWithRPC(Account.from_key(key), rpc))

    sent: dict[str, str | None] = {"header": None}
    statuses: list[int] = []

    def fetch(target: str, headers: dict[str, str]) -> _RefundResponse:
        """The SDK's GET, watched: what it sent last, and each status."""
        for name, value in headers.items():
            if name.lower() == "payment-signature":
                sent["header"] = value
        request = urllib.request.Request(target, headers=headers, method="GET")
        try:
            with urllib.request.urlopen(request) as answer:
                status, answered = answer.status, dict(answer.headers)
        except urllib.error.HTTPError as answer:
            status, answered = answer.code, dict(answer.headers)
        statuses.append(status)
        return _RefundResponse(status=status, headers=answered)

    try:
        settled = client.refund(url, RefundOptions(amount=amount, fetch=fetch))
        out = {"settled": settled.model_dump(mode="json", by_alias=True, exclude_none=True)}
    except Exception as e:  # noqa: BLE001 - the caller reads it
        out = {"error": str(e)}
    print(json.dumps({**out, "header": sent["header"], "statuses": statuses}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
