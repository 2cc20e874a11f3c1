"""An agent without a wallet buys a priced tool over MCP 2026-07-28 with the
official MCP Python SDK 2.x: the call answers an `input_required` result
holding a URL elicitation (Reeve's pay link); the SDK hands the URL to the
client's elicitation callback and, once it accepts, retries the call with the
result's `requestState`, which answers the task. The callback stands for the
person: it pays the link as the console's pay page does (`POST
/v1/pay-link`, the offer's `402`, then the payment signed by coinbase's x402
Python SDK). Run by scripts/mcp-clients.sh against its `reeve serve`:

    REEVE_MCP_URL=… REEVE_CHAIN_RPC_URL=… REEVE_WALLET_KEY=0x… python tests/mcp/modern.py

Exits 0 when every check holds, printing what it saw; otherwise says which
check failed. The key comes from the environment, never from an argument.
"""

import asyncio
import base64
import hashlib
import json
import os
import sys
import urllib.error
import urllib.request

import httpx2
import mcp_types as types
from eth_account import Account
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from x402 import x402ClientSync
from x402.http.utils import encode_payment_signature_header
from x402.mechanisms.evm.exact import ExactEvmScheme
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.schemas import PaymentRequired

MODERN = "2026-07-28"
# tests/mcp/catalog.toml: paid_digest costs 0.01 of the local 6-decimal token.
PAID = "paid_digest"
PRICE = 10_000
NETWORK = "eip155:84532"
TOKEN = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
TEXT = b"hello, reeve, from the MCP Python SDK 2\n"


def check(condition: bool, what: str, seen: object = None) -> None:
    if not condition:
        sys.exit(f"modern.py: {what}" + (f": {json.dumps(seen, default=str)}" if seen is not None else ""))


def rpc(method: str, params: list) -> object:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    request = urllib.request.Request(os.environ["REEVE_CHAIN_RPC_URL"], data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request) as answer:
        return json.loads(answer.read())["result"]


def balance(address: str) -> int:
    data = "0x70a08231" + address[2:].lower().rjust(64, "0")
    return int(rpc("eth_call", [{"to": TOKEN, "data": data}, "latest"]), 16)


def pay_link(base: str, token: str, payment: str | None):
    """`POST /v1/pay-link` as the pay page sends it: status, headers, body."""
    headers = {"authorization": f"PayLink {token}"}
    if payment:
        headers["payment-signature"] = payment
    request = urllib.request.Request(f"{base}/v1/pay-link", data=b"", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, answer.headers, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as answer:
        return answer.code, answer.headers, json.loads(answer.read() or b"null")


class Person:
    """The person the agent hands the pay link to: pays it from a wallet."""

    def __init__(self, base: str, key: str):
        self.base = base
        self.client = x402ClientSync().register(NETWORK, ExactEvmScheme(signer=EthAccountSigner(Account.from_key(key))))
        self.asked: list[types.ElicitRequestParams] = []
        self.bought: list[str] = []

    async def elicit(self, _context, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params)
        url = getattr(params, "url", None)
        check(url is not None and "#pay=" in url, "a URL elicitation with a pay link", params.model_dump())
        token = url.split("#pay=", 1)[1]
        return await asyncio.to_thread(self.pay, token)

    def pay(self, token: str) -> types.ElicitResult:
        status, headers, body = pay_link(self.base, token, None)
        check(status == 402 and headers.get("payment-required"), "the link's offer is a 402", body)
        required = PaymentRequired.model_validate(json.loads(base64.b64decode(headers["payment-required"])))
        payment = encode_payment_signature_header(self.client.create_payment_payload(required))
        status, headers, body = pay_link(self.base, token, payment)
        check(status == 202 and headers.get("payment-response"), "the link paid makes the task", body)
        self.bought.append(body["id"])
        return types.ElicitResult(action="accept")


async def main() -> None:
    url, key = os.environ["REEVE_MCP_URL"], os.environ["REEVE_WALLET_KEY"]
    base = url.removesuffix("/mcp")
    async with Client(url, mode=MODERN) as anonymous:
        check(anonymous.protocol_version == MODERN, "the server speaks 2026-07-28", anonymous.protocol_version)
        created = await anonymous.call_tool("create_space", {})
        token = created.structured_content["token"]
    person = Person(base, key)
    payer = Account.from_key(key).address
    http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=60)
    async with Client(streamable_http_client(url, http_client=http), mode=MODERN,
                      elicitation_callback=person.elicit) as agent:
        stored = await agent.call_tool("create_upload", {
            "filename": "hello.txt", "content_type": "text/plain",
            "content_base64": base64.b64encode(TEXT).decode()})
        upload = stored.structured_content["upload_id"]
        before = balance(payer)

        # One call: input_required, the link paid by the person, the retry.
        result = await agent.call_tool(PAID, {"upload_id": upload, "wait_seconds": 20})
        task = result.structured_content
        check(not result.is_error, "the retried call answers the task", task)
        check(len(person.asked) == 1 and person.bought == [task["id"]], "one link, paid once, that task",
              {"asked": len(person.asked), "bought": person.bought, "task": task["id"]})
        check(task["kind"] == PAID and task["status"] == "completed", "the task ran", task)
        check(task["result"]["sha256"] == hashlib.sha256(TEXT).hexdigest(), "the file's SHA-256", task)
        check(balance(payer) == before - PRICE, "the payer paid exactly the price, once",
              {"before": before, "after": balance(payer)})
        listed = await agent.call_tool("list_tasks", {"kind": PAID})
        ids = [t["id"] for t in listed.structured_content["tasks"]]
        check(ids == [task["id"]], "one paid task in the Space", ids)
    print(json.dumps({"protocol": MODERN, "task": task["id"], "elicitations": len(person.asked),
                      "charged": PRICE}))


if __name__ == "__main__":
    asyncio.run(main())
