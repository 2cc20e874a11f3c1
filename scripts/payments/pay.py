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


def main() -> int:
    key = os.environ.get("REEVE_WALLET_KEY")
    if not key:
        print("REEVE_WALLET_KEY is not set", file=sys.stderr)
        return 2
    text = sys.stdin.read().strip()
    if text.startswith("{"):
        required = PaymentRequired.model_validate(json.loads(text))
    else:
        required = decode_payment_required_header(text)
    account = Account.from_key(key)
    signer = EthAccountSignerWithRPC(account, sys.argv[1]) if len(sys.argv) > 1 else EthAccountSigner(account)
    client = x402ClientSync()
    client.set_spend_controls(False)
    client.register(NETWORK, ExactEvmScheme(signer=signer))
    client.register(NETWORK, UptoEvmScheme(signer))
    payload = client.create_payment_payload(required)
    print(encode_payment_signature_header(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
