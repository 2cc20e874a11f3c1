"""Drives Reeve's MCP endpoint as an agent would, with the official clients only:
the MCP Python SDK (`mcp`, Streamable HTTP) and coinbase's x402 SDK with its
MCP session (`x402[mcp]`), which pays priced tools on the local chain.

    REEVE_MCP_URL=http://127.0.0.1:PORT/mcp python tests/mcp/client.py SCENARIO

Each scenario prints one JSON document: what the client saw, call by call
(a tool result as the SDK parsed it, a JSON-RPC error, or the exception the
SDK raised). The Rust test that starts the server (shared/tests/suite/mcp.rs)
asserts on it, so this file holds no expectations of its own. Inputs come
from the environment: REEVE_MCP_TEXT (the file to upload), REEVE_MCP_KIND (a
priced tool), REEVE_WALLET_KEY (the payer's key; never an argument), and for
pay-base64 the token and upload of an earlier run (REEVE_MCP_TOKEN,
REEVE_MCP_UPLOAD); for progress, how many times to repeat the text
(REEVE_MCP_REPEAT); for pay-metered, the URL the metered tool fetches
(REEVE_MCP_FETCH_URL) and the chain's RPC (REEVE_CHAIN_RPC_URL), which the
upto client reads to sign the token's permit when Permit2 is not approved.
"""

import asyncio
import base64
import json
import os
import sys
from contextlib import asynccontextmanager
from datetime import timedelta

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import McpError

URL = os.environ["REEVE_MCP_URL"]
NETWORK = "eip155:84532"
# Well past any server-side wait: a tool that waits answers within its own bound.
TIMEOUT = timedelta(seconds=60)


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"{name} is not set")
    return value


@asynccontextmanager
async def session(token: str | None = None):
    """One initialised MCP session, with the token as `Authorization: Bearer`."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(URL, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                yield s, init


def dump(model) -> dict:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def call(s: ClientSession, name: str, arguments: dict, **options) -> dict:
    """A tool call as the client saw it: `result`, `error` (JSON-RPC) or `exception`."""
    try:
        return {"result": dump(await s.call_tool(name, arguments, read_timeout_seconds=TIMEOUT, **options))}
    except McpError as e:
        return {"error": dump(e.error)}
    except Exception as e:  # the SDK's own refusal, e.g. output that fails the tool's outputSchema
        return {"exception": f"{type(e).__name__}: {e}"}


def structured(answer: dict) -> dict:
    if "result" not in answer or answer["result"].get("isError"):
        raise SystemExit(f"the call failed: {json.dumps(answer)}")
    return answer["result"]["structuredContent"]


def inline(text: str, name: str = "hello.txt") -> dict:
    return {
        "filename": name,
        "content_type": "text/plain",
        "content_base64": base64.b64encode(text.encode()).decode(),
    }


async def journey() -> dict:
    """initialize, list the tools, create a Space, upload inline, digest (waiting),
    read the task back, list the tasks, open a second session with `login`."""
    out: dict = {}
    async with session() as (s, init):
        out["initialize"] = dump(init)
        out["tools"] = [dump(t) for t in (await s.list_tools()).tools]
        out["anonymous_list_tasks"] = await call(s, "list_tasks", {})
        out["create_space"] = await call(s, "create_space", {})
    space = structured(out["create_space"])
    async with session(space["token"]) as (s, _):
        out["upload"] = await call(s, "create_upload", inline(env("REEVE_MCP_TEXT")))
        upload = structured(out["upload"])["upload_id"]
        out["digest"] = await call(s, "digest", {"upload_id": upload, "wait_seconds": 20})
        task = structured(out["digest"])["id"]
        out["get_task"] = await call(s, "get_task", {"task_id": task})
        out["get_result"] = await call(s, "get_result", {"task_id": task})
        out["list_tasks"] = await call(s, "list_tasks", {"limit": 10})
        out["login"] = await call(s, "login", {"space_id": space["space_id"]})
    out["space"] = space
    out["upload_id"] = upload
    return out


async def start() -> tuple[str, str]:
    """A new Space's token, and an inline upload of REEVE_MCP_TEXT in it."""
    async with session() as (s, _):
        token = structured(await call(s, "create_space", {}))["token"]
    async with session(token) as (s, _):
        upload = structured(await call(s, "create_upload", inline(env("REEVE_MCP_TEXT"))))["upload_id"]
    return token, upload


async def queued() -> dict:
    """With no worker running: create a task without waiting, then cancel it."""
    token, upload = await start()
    async with session(token) as (s, _):
        created = await call(s, "digest", {"upload_id": upload})
        task = structured(created)
        return {"created": created, "cancel": await call(s, "cancel_task", {"task_id": task["id"]})}


async def progress() -> dict:
    """A presigned upload of a few MiB (PUT as the URL says), then a waiting
    digest whose request carries a progressToken (the SDK sets one when given
    a callback): the notifications/progress it receives, in order."""
    text = env("REEVE_MCP_TEXT") * int(os.environ.get("REEVE_MCP_REPEAT", "1"))
    seen: list[dict] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        seen.append({"progress": value, "total": total, "message": message})

    async with session() as (s, _):
        token = structured(await call(s, "create_space", {}))["token"]
    async with session(token) as (s, _):
        size = len(text.encode())
        upload = structured(
            await call(s, "create_upload", {"filename": "big.txt", "content_type": "text/plain", "size": size})
        )
        async with httpx.AsyncClient() as http:
            put = await http.request(upload["method"], upload["url"], headers=upload["headers"], content=text.encode())
        digest = await call(
            s, "digest", {"upload_id": upload["upload_id"], "wait_seconds": 20}, progress_callback=on_progress
        )
        return {"put_status": put.status_code, "digest": digest, "progress": seen}


def payer():
    """coinbase's async x402 client on the local chain only, so it picks the
    local requirement; spend controls off (the local token is not one it knows).
    Both EVM schemes are registered, as a wallet that pays any Reeve tool has
    them: `exact` (EIP-3009) and `upto` (a Permit2 ceiling, charged what the
    task used). Given the chain's RPC, the signer reads the payer's Permit2
    allowance, so a payer that never approved it (and holds no gas) signs the
    token's EIP-2612 permit the challenge offers. Every payload it signs is
    kept, so a test can send one again."""
    from eth_account import Account
    from x402 import x402Client
    from x402.mechanisms.evm.exact import ExactEvmScheme
    from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
    from x402.mechanisms.evm.upto import UptoEvmScheme

    account = Account.from_key(env("REEVE_WALLET_KEY"))
    rpc = os.environ.get("REEVE_CHAIN_RPC_URL")
    signer = EthAccountSignerWithRPC(account, rpc) if rpc else EthAccountSigner(account)
    client = x402Client()
    client.set_spend_controls(False)
    client.register(NETWORK, ExactEvmScheme(signer=signer))
    client.register(NETWORK, UptoEvmScheme(signer))
    signed: list = []
    client.on_after_payment_creation(lambda ctx: signed.append(ctx.payment_payload))
    return client, signed


async def pay() -> dict:
    """The whole job with only a wallet: create a Space, upload, call a priced
    tool through x402's MCP session (it sees the payment required, pays, and
    retries), then send the very same payment again."""
    from x402.mcp import x402MCPSession

    kind = env("REEVE_MCP_KIND")
    client, signed = payer()
    out: dict = {}
    async with session() as (s, _):
        space = structured(await call(s, "create_space", {}))
    async with session(space["token"]) as (s, _):
        upload = structured(await call(s, "create_upload", inline(env("REEVE_MCP_TEXT"))))["upload_id"]
        arguments = {"upload_id": upload, "wait_seconds": 20}
        paid = await x402MCPSession(s, client).call_tool(kind, arguments, read_timeout_seconds=TIMEOUT)
        out["paid"] = {
            "payment_made": paid.payment_made,
            "is_error": paid.is_error,
            "payment_response": dump(paid.payment_response) if hasattr(paid.payment_response, "model_dump") else paid.payment_response,
            "result": dump(paid.raw_result),
        }
        out["signed"] = len(signed)
        again = {"x402/payment": signed[0].model_dump(mode="json", by_alias=True, exclude_none=True)}
        out["replayed"] = await call(s, kind, arguments, meta=again)
    out["token"] = space["token"]
    out["upload_id"] = upload
    return out


async def pay_metered() -> dict:
    """A metered tool with only a wallet: the tool as listed, its challenge
    (a call without payment), then a call through x402's MCP session (it sees
    the payment required, signs the upto ceiling, and retries), waiting for
    the task to end and be charged."""
    from x402.mcp import x402MCPSession

    kind = env("REEVE_MCP_KIND")
    client, signed = payer()
    out: dict = {}
    async with session() as (s, _):
        out["tool"] = next(dump(t) for t in (await s.list_tools()).tools if t.name == kind)
        space = structured(await call(s, "create_space", {}))
    async with session(space["token"]) as (s, _):
        arguments = {"url": env("REEVE_MCP_FETCH_URL"), "wait_seconds": 20}
        out["unpaid"] = await call(s, kind, arguments)
        paid = await x402MCPSession(s, client).call_tool(kind, arguments, read_timeout_seconds=TIMEOUT)
        out["paid"] = {
            "payment_made": paid.payment_made,
            "is_error": paid.is_error,
            "payment_response": dump(paid.payment_response) if hasattr(paid.payment_response, "model_dump") else paid.payment_response,
            "result": dump(paid.raw_result),
        }
    out["signed"] = [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in signed]
    out["token"] = space["token"]
    return out


async def pay_base64() -> dict:
    """A payment sent as a base64 string in `_meta["x402/payment"]` (as
    Cloudflare's client sends it) rather than as the spec's object."""
    from x402.http.utils import encode_payment_signature_header
    from x402.schemas import PaymentRequired

    kind = env("REEVE_MCP_KIND")
    client, _ = payer()
    async with session(env("REEVE_MCP_TOKEN")) as (s, _):
        arguments = {"upload_id": env("REEVE_MCP_UPLOAD"), "wait_seconds": 20}
        unpaid = await call(s, kind, arguments)
        required = PaymentRequired.model_validate(unpaid["result"]["structuredContent"])
        header = encode_payment_signature_header(await client.create_payment_payload(required))
        return {"unpaid": unpaid, "paid": await call(s, kind, arguments, meta={"x402/payment": header})}


async def bad() -> dict:
    """Each bad input an agent can send, through the official client."""
    kind = env("REEVE_MCP_KIND")
    token, upload = await start()
    out: dict = {}
    async with session(token) as (s, _):
        out["unknown_tool"] = await call(s, "no_such_tool", {})
        out["schema"] = await call(s, "digest", {"upload_id": 42})
        out["fixed_tool_schema"] = await call(s, "get_task", {})
        out["wait_too_long"] = await call(s, "digest", {"upload_id": upload, "wait_seconds": 3600})
        out["payment_not_base64"] = await call(s, kind, {"upload_id": upload}, meta={"x402/payment": "%%% not base64"})
        out["payment_wrong_shape"] = await call(s, kind, {"upload_id": upload}, meta={"x402/payment": {"x402Version": 2}})
        out["inline_too_large"] = await call(s, "create_upload", inline("x" * (1024 * 1024 + 1), "big.txt"))
        out["bad_base64"] = await call(
            s, "create_upload", {"filename": "a.txt", "content_type": "text/plain", "content_base64": "***"}
        )
    async with session("not-a-token") as (s, _):
        out["bad_token"] = await call(s, "list_tasks", {})
    # A body past the endpoint's limit: the server refuses it unread (HTTP 413),
    # and the SDK raises.
    try:
        async with session(token) as (s, _):
            out["body_too_large"] = await call(s, "create_upload", inline("x" * (3 * 1024 * 1024), "huge.txt"))
    except BaseException as e:  # the SDK's task group re-raises the transport's HTTP error
        out["body_too_large"] = {"exception": describe(e)}
    return out


def describe(e: BaseException) -> str:
    """An exception, with those of an exception group flattened."""
    inner = getattr(e, "exceptions", None)
    if inner:
        return "; ".join(describe(x) for x in inner)
    return f"{type(e).__name__}: {e}"


SCENARIOS = {
    "journey": journey,
    "queued": queued,
    "progress": progress,
    "pay": pay,
    "pay-base64": pay_base64,
    "pay-metered": pay_metered,
    "bad": bad,
}


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in SCENARIOS:
        print(f"usage: client.py {{{'|'.join(SCENARIOS)}}}", file=sys.stderr)
        return 2
    print(json.dumps(asyncio.run(SCENARIOS[sys.argv[1]]())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
