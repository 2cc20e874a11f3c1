// The official TypeScript MCP SDK (@modelcontextprotocol/sdk) against a real
// `reeve serve`, paying with the official TypeScript x402 client
// (@x402/core + @x402/evm) on the local chain, as an agent built on them
// would. Run by scripts/mcp-clients.sh, which starts the server on
// tests/mcp/catalog.toml, holds the chain harness's lock, and funds the payer:
//   REEVE_MCP_URL        the server's /mcp
//   REEVE_MCP_PAYER_KEY  the payer's key (funded; nobody else pays from it)
//   REEVE_CHAIN_RPC_URL  the local chain
//
// The resend (an agent whose answer was lost) gets what it bought, not a
// second charge. A metered tool (x402's upto) is paid with @x402/evm's upto
// client, from a wallet that never approved Permit2: it signs the token's
// permit the challenge offers, and is charged what the task used. A tool
// priced by batch settlement is paid from an escrow channel with
// @x402/evm's batch-settlement client: one deposit, then vouchers. Every answer goes through `Client.callTool` after
// `listTools`, so the SDK checks each `structuredContent` against the tool's
// outputSchema, errors and payment requests included: the check that made
// this client throw at Reeve's payment answer before.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { x402Client } from "@x402/core/client";
import { toClientEvmSigner } from "@x402/evm";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { BatchSettlementEvmScheme } from "@x402/evm/batch-settlement/client";
import { createPublicClient, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const URL_ = new URL(process.env.REEVE_MCP_URL);
const RPC = process.env.REEVE_CHAIN_RPC_URL || "http://127.0.0.1:8545";
const PAYER = privateKeyToAccount(process.env.REEVE_MCP_PAYER_KEY);
const NETWORK = "eip155:84532";
const TOKEN = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
// tests/mcp/catalog.toml: paid_digest costs $0.01 of the 6-decimal token.
const PAID = "paid_digest";
const PRICE = 10000n;
// And metered_digest: up to 0.1 of it, 3 atomic units per byte hashed.
const METERED = "metered_digest";
const RATE = 3n;
const CEILING = 100000n;
// And batch_digest: 0.001 of it a task, paid by x402's batch settlement.
const BATCH = "batch_digest";
const BATCH_PRICE = 1000n;
// keccak256("Transfer(address,address,uint256)")
const TRANSFER = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef";
const TEXT = "hello, reeve, from the TypeScript SDK\n";
const SHA256 = createHash("sha256").update(TEXT).digest("hex");
// Past any server-side wait: a tool that waits answers within its own bound.
const TIMEOUT = { timeout: 60_000 };

async function rpc(method, params) {
  const answer = await (await fetch(RPC, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }) })).json();
  if (answer.error) throw new Error(`${method}: ${JSON.stringify(answer.error)}`);
  return answer.result;
}
const word = (address) => `0x${address.slice(2).toLowerCase().padStart(64, "0")}`;
async function balance(address) {
  return BigInt(await rpc("eth_call", [{ to: TOKEN, data: `0x70a08231${word(address).slice(2)}` }, "latest"]));
}
/** The token transfers of a settlement's transaction: [from, to, value]. */
async function transfers(transaction) {
  const receipt = await rpc("eth_getTransactionReceipt", [transaction]);
  assert.equal(receipt.status, "0x1", `the settlement's transaction succeeded: ${transaction}`);
  return receipt.logs
    .filter((log) => log.address.toLowerCase() === TOKEN.toLowerCase() && log.topics[0] === TRANSFER)
    .map((log) => [log.topics[1], log.topics[2], BigInt(log.data)]);
}

/** An MCP client on the server, its session token sent as the spec's bearer. */
async function connect(token) {
  const client = new Client({ name: "reeve-sdk-test", version: "1.0.0" });
  const headers = token ? { authorization: `Bearer ${token}` } : {};
  await client.connect(new StreamableHTTPClientTransport(URL_, { requestInit: { headers } }));
  return client;
}

let anonymous, agent, tools, space, upload, x402, metered;

before(async () => {
  anonymous = await connect();
  const created = await anonymous.callTool({ name: "create_space", arguments: {} });
  space = created.structuredContent;
  agent = await connect(space.token);
  // listTools first, as an agent does: the SDK keeps each outputSchema and
  // checks every later callTool's structuredContent against it.
  ({ tools } = await agent.listTools());
  const stored = await agent.callTool({ name: "create_upload", arguments: {
    filename: "hello.txt", content_type: "text/plain", content_base64: Buffer.from(TEXT).toString("base64") } });
  upload = stored.structuredContent;
  x402 = new x402Client();
  // The local chain only, so the local price of the challenge is the one signed.
  registerExactEvmScheme(x402, { signer: PAYER, networks: [NETWORK] });
  // Both schemes, as a wallet that pays any tool has them. The signer reads
  // the chain (the payer's Permit2 allowance, for the permit); the local
  // token is none of the SDK's known assets, so spend controls name it.
  const signer = toClientEvmSigner(PAYER, createPublicClient({ transport: http(RPC) }));
  metered = new x402Client();
  registerExactEvmScheme(metered, { signer, networks: [NETWORK] });
  metered.register(NETWORK, new UptoEvmScheme(signer))
    .setSpendControls({ allowedAssets: [{ network: NETWORK, asset: TOKEN }] });
});

after(async () => {
  await agent?.close();
  await anonymous?.close();
});

test("discovery: initialize names the server, tools/list gives each tool an object output schema and the price", () => {
  assert.equal(agent.getServerVersion().name, "reeve");
  const names = tools.map((t) => t.name);
  for (const name of ["create_space", "login", "create_upload", "get_task", "list_tasks", "cancel_task", "get_result",
    "digest", PAID]) {
    assert.ok(names.includes(name), `${name} in ${names}`);
  }
  for (const tool of tools) {
    assert.equal(tool.outputSchema?.type, "object", `${tool.name}'s outputSchema is an object schema`);
  }
  const paid = tools.find((t) => t.name === PAID);
  assert.deepEqual(paid.inputSchema.required, ["upload_id"]);
  assert.equal(paid._meta["reeve/price"].free, false);
  assert.equal(paid._meta["reeve/price"].prices[0].amount, PRICE.toString());
  assert.equal(space.space_id.length, 20);
  assert.equal(upload.uploaded, true);
});

test("a tool error reaches the caller through callTool: its code and message, not a schema failure", async () => {
  const missing = await agent.callTool({ name: "get_task", arguments: { task_id: "01HZX3Y4P5Q6R7S8T9V0W1X2Y3" } });
  assert.equal(missing.isError, true);
  assert.equal(missing.structuredContent.error.code, "task_not_found");
  assert.deepEqual(JSON.parse(missing.content[0].text), missing.structuredContent);
  const invalid = await agent.callTool({ name: PAID, arguments: { upload_id: "not a ULID" } });
  assert.equal(invalid.isError, true);
  assert.equal(invalid.structuredContent.error.code, "invalid_input");
});

test("a free digest, waited for: the task completed with the file's SHA-256", async () => {
  const done = await agent.callTool({ name: "digest", arguments: { upload_id: upload.upload_id, wait_seconds: 20 } },
    undefined, TIMEOUT);
  assert.notEqual(done.isError, true, JSON.stringify(done));
  assert.equal(done.structuredContent.status, "completed");
  assert.equal(done.structuredContent.result.sha256, SHA256);
});

let challenge;

test("an unpaid priced call answers x402's PaymentRequired through callTool, and charges nothing", async () => {
  const before = await balance(PAYER.address);
  const unpaid = await agent.callTool({ name: PAID, arguments: { upload_id: upload.upload_id } });
  assert.equal(unpaid.isError, true);
  challenge = unpaid.structuredContent;
  assert.equal(challenge.x402Version, 2);
  assert.equal(challenge.resource.url, `mcp://tool/${PAID}`);
  const local = challenge.accepts.find((a) => a.network === NETWORK);
  assert.equal(local.amount, PRICE.toString());
  assert.equal(local.asset, TOKEN);
  assert.deepEqual(JSON.parse(unpaid.content[0].text), challenge, "content[0].text is the same PaymentRequired");
  assert.equal(challenge.extensions.bazaar.info.input.toolName, PAID);
  assert.equal(await balance(PAYER.address), before);
});

let payment, paid;

test("paid with the TypeScript x402 client: the task, its receipt, and exactly the price moved", async () => {
  const before = await balance(PAYER.address);
  payment = await x402.createPaymentPayload(challenge);
  assert.equal(payment.accepted.network, NETWORK);
  const answer = await agent.callTool({ name: PAID, arguments: { upload_id: upload.upload_id, wait_seconds: 20 },
    _meta: { "x402/payment": payment } }, undefined, TIMEOUT);
  assert.notEqual(answer.isError, true, JSON.stringify(answer));
  paid = answer;
  const task = answer.structuredContent;
  assert.equal(task.kind, PAID);
  assert.equal(task.status, "completed");
  assert.equal(task.result.sha256, SHA256);
  const receipt = answer._meta["x402/payment-response"];
  assert.equal(receipt.success, true);
  assert.equal(receipt.network, NETWORK);
  assert.equal(receipt.payer.toLowerCase(), PAYER.address.toLowerCase());
  assert.equal(await balance(PAYER.address), before - PRICE, "the payer paid exactly the price");
  const payTo = challenge.accepts.find((a) => a.network === NETWORK).payTo;
  assert.deepEqual(await transfers(receipt.transaction), [[word(PAYER.address), word(payTo), PRICE]],
    "the receipt's transaction moved the price from the payer to payTo, and nothing else");
});

test("the same payment sent again: the task it bought and its receipt, and no second transfer", async () => {
  const before = await balance(PAYER.address);
  const again = await agent.callTool({ name: PAID, arguments: { upload_id: upload.upload_id, wait_seconds: 20 },
    _meta: { "x402/payment": payment } }, undefined, TIMEOUT);
  assert.notEqual(again.isError, true, JSON.stringify(again));
  assert.equal(again.structuredContent.id, paid.structuredContent.id, "the same task");
  assert.deepEqual(again._meta["x402/payment-response"], paid._meta["x402/payment-response"], "the stored receipt");
  assert.equal(await balance(PAYER.address), before, "nothing moved");
  const listed = await agent.callTool({ name: "list_tasks", arguments: { kind: PAID } });
  assert.deepEqual(listed.structuredContent.tasks.map((t) => t.id), [paid.structuredContent.id], "one paid task");
});

test("a metered tool paid with the TypeScript upto client: charged exactly what it used, once, when it ended", async () => {
  const tool = tools.find((t) => t.name === METERED);
  const summary = `up to ${CEILING} atomic units of usdc-base-sepolia, charged ${RATE} atomic units per byte used; `
    + "nothing if the task fails";
  assert.ok(tool.description.includes(`Metered price: on ${NETWORK}, ${summary}.`), tool.description);
  const price = tool._meta["reeve/price"].prices[0];
  assert.deepEqual([price.scheme, price.unit, price.rate, price.summary], ["upto", "byte", RATE.toString(), summary]);

  const before = await balance(PAYER.address);
  const unpaid = await agent.callTool({ name: METERED, arguments: { upload_id: upload.upload_id } });
  assert.equal(unpaid.isError, true);
  const offered = unpaid.structuredContent;
  assert.deepEqual([offered.accepts[0].scheme, offered.accepts[0].amount], ["upto", CEILING.toString()]);
  assert.ok(offered.extensions.eip2612GasSponsoring, JSON.stringify(offered));
  const signed = await metered.createPaymentPayload(offered);
  assert.equal(signed.accepted.scheme, "upto");
  assert.ok(signed.extensions?.eip2612GasSponsoring?.info?.signature, "the permit, in place of an approval");

  const answer = await agent.callTool({ name: METERED, arguments: { upload_id: upload.upload_id, wait_seconds: 20 },
    _meta: { "x402/payment": signed } }, undefined, TIMEOUT);
  assert.notEqual(answer.isError, true, JSON.stringify(answer));
  const task = answer.structuredContent;
  assert.deepEqual([task.kind, task.status, task.result.sha256], [METERED, "completed", SHA256]);
  const used = BigInt(Buffer.byteLength(TEXT)) * RATE;
  const payment = task.payment;
  assert.deepEqual([payment.scheme, payment.status, payment.charged, payment.used],
    ["upto", "charged", used.toString(), Buffer.byteLength(TEXT)], JSON.stringify(payment));
  const receipt = answer._meta["x402/payment-response"];
  assert.deepEqual([receipt.success, receipt.amount, receipt.transaction], [true, used.toString(), payment.transaction]);
  assert.equal(await balance(PAYER.address), before - used, "the payer paid exactly bytes × rate");
  assert.deepEqual(await transfers(receipt.transaction), [[word(PAYER.address), word(offered.accepts[0].payTo), used]],
    "the capture moved what was used from the payer to payTo, and nothing else");
});

/**
 * One call of the batch-priced tool, paid by `client` (its channel state
 * kept across calls, as @x402/mcp's wrapper keeps it): asked unpaid, paid,
 * and after a corrective payment-required answer, resynchronised and paid
 * once more. Answers the paid answer, the payload types sent, and whether
 * it resynchronised. (The same payment for the same input is a retry: it
 * answers the task it bought.)
 */
async function batchCall(client, uploadId = upload.upload_id) {
  const args = { upload_id: uploadId, wait_seconds: 20 };
  const unpaid = await agent.callTool({ name: BATCH, arguments: args });
  assert.equal(unpaid.isError, true);
  const required = unpaid.structuredContent;
  const sent = [];
  let recovered = false;
  for (;;) {
    const payload = await client.createPaymentPayload(required);
    sent.push(payload.payload.type);
    const answer = await agent.callTool({ name: BATCH, arguments: args, _meta: { "x402/payment": payload } },
      undefined, TIMEOUT);
    const settleResponse = answer._meta?.["x402/payment-response"];
    const refusal = answer.isError ? answer.structuredContent : undefined;
    const handled = await client.handlePaymentResponse({ paymentPayload: payload, requirements: payload.accepted,
      ...(settleResponse ? { settleResponse } : {}), ...(refusal?.accepts ? { paymentRequired: refusal } : {}) });
    if (!answer.isError) return { answer, sent, recovered };
    assert.ok(handled?.recovered && !recovered, `refused: ${JSON.stringify(refusal)}`);
    recovered = true;
  }
}

test("a tool paid by batch settlement: one deposit, then vouchers with no transaction, each call its own task", async () => {
  const signer = toClientEvmSigner(PAYER, createPublicClient({ transport: http(RPC) }));
  const wallet = () => new x402Client().register(NETWORK, new BatchSettlementEvmScheme(signer));
  const client = wallet();
  const before = await balance(PAYER.address);

  const first = await batchCall(client);
  assert.deepEqual([first.sent, first.recovered], [["deposit"], false]);
  const task = first.answer.structuredContent;
  assert.deepEqual([task.kind, task.status, task.result.sha256], [BATCH, "completed", SHA256]);
  const receipt = first.answer._meta["x402/payment-response"];
  assert.equal(receipt.success, true, JSON.stringify(receipt));
  const deposited = before - await balance(PAYER.address);
  assert.ok(deposited >= BATCH_PRICE, `one deposit of at least the price: ${deposited}`);
  assert.equal(receipt.extra.channelState.balance, deposited.toString(), JSON.stringify(receipt));
  assert.equal(receipt.extra.chargedAmount, BATCH_PRICE.toString(), JSON.stringify(receipt));
  assert.equal(receipt.extra.channelState.chargedCumulativeAmount, BATCH_PRICE.toString());

  // The next call: a voucher alone, checked by Reeve with no transaction.
  const second = await batchCall(client);
  assert.deepEqual([second.sent, second.recovered], [["voucher"], false]);
  assert.notEqual(second.answer.structuredContent.id, task.id, "a task of its own");
  assert.equal(second.answer._meta["x402/payment-response"].transaction, "", "no transaction until a claim");
  const charged = (answer) => answer._meta["x402/payment-response"].extra.channelState.chargedCumulativeAmount;
  assert.equal(charged(second.answer), (2n * BATCH_PRICE).toString());
  assert.equal(before - await balance(PAYER.address), deposited, "nothing moved for the voucher");

  // A wallet with no state of the channel, for another file: its first
  // voucher (one price on what the chain shows claimed, nothing) is refused
  // with where the channel stands, and it pays the third with the next.
  const other = await agent.callTool({ name: "create_upload", arguments: {
    filename: "other.txt", content_type: "text/plain", content_base64: Buffer.from("other\n").toString("base64") } });
  const third = await batchCall(wallet(), other.structuredContent.upload_id);
  assert.deepEqual([third.sent, third.recovered], [["voucher", "voucher"], true]);
  assert.equal(charged(third.answer), (3n * BATCH_PRICE).toString());
  assert.equal(before - await balance(PAYER.address), deposited, "still the one deposit");
  const listed = await agent.callTool({ name: "list_tasks", arguments: { kind: BATCH } });
  assert.equal(listed.structuredContent.tasks.length, 3, "three calls, three tasks");
});
