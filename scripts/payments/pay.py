"""Pays a Reeve 402 with coinbase's official x402 Python SDK.

    REEVE_WALLET_KEY=0x… python pay.py [rpc url] < challenge.json  →  PAYMENT-SIGNATURE value

Reads the 402 challenge (its JSON body, or the base64 PAYMENT-REQUIRED header
value) on stdin and prints the header value to send. Both of the SDK's EVM
schemes are registered, `exact` (EIP-3009) and `upto` (Permit2, a signed
ceiling the seller settles the used part of); only the local chain
(eip155:84532) is, so the SDK picks the local requirement. Spend controls are
off because the local token is not one of the SDK's known assets. Given the
chain's RPC URL, the upto client reads the payer's Permit2 allowance and signs
the token's EIP-2612 permit instead when the 402 offers gas sponsoring. The
key comes from the environment, never from an argument.

    python pay.py --serve [rpc url]

signs many: one JSON object a line on stdin, {"key": "0x…", "challenge":
"…"}, each answered by a line {"header": "…"} or {"error": "…"}, until
stdin closes. The tests keep one running, since each start imports the SDK
again (over a second of CPU) and they sign some two hundred payments.
"""

import json
import os
import sys

from eth_account import Account
from x402 import x402ClientSync
from x402.http.utils import decode_payment_required_header, encode_payment_signature_header
from x402.mechanisms.evm.exact import ExactEvmScheme
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.mechanisms.evm.upto import UptoEvmScheme
from x402.schemas import PaymentRequired

NETWORK = "eip155:84532"


def sign(key: str, text: str, rpc: str | None) -> str:
    """The PAYMENT-SIGNATURE header value for the challenge `text`."""
    text = text.strip()
    if text.startswith("{"):
        required = PaymentRequired.model_validate(json.loads(text))
    else:
        required = decode_payment_required_header(text)
    account = Account.from_key(key)
    signer = EthAccountSignerWithRPC(account, rpc) if rpc else EthAccountSigner(account)
    client = x402ClientSync()
    client.set_spend_controls(False)
    client.register(NETWORK, ExactEvmScheme(signer=signer))
    client.register(NETWORK, UptoEvmScheme(signer))
    return encode_payment_signature_header(client.create_payment_payload(required))


def serve(rpc: str | None) -> int:
    for line in sys.stdin:
        try:
            request = json.loads(line)
            answer = {"header": sign(request["key"], request["challenge"], rpc)}
        except Exception as e:  # noqa: BLE001 - the caller reports it
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)
    return 0


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--serve"]:
        return serve(args[1] if len(args) > 1 else None)
    key = os.environ.get("REEVE_WALLET_KEY")
    if not key:
        print("REEVE_WALLET_KEY is not set", file=sys.stderr)
        return 2
    print(sign(key, sys.stdin.read(), args[0] if args else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
