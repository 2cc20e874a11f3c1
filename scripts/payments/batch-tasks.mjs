// The official batch-settlement buyer paying Reeve's REST create: @x402/core's
// HTTP client with @x402/evm's batch-settlement client, creating <count>
// tasks of one kind over the payer's one channel to Reeve, as @x402/fetch
// pays: ask, get the 402, pay, and after a corrective 402 (the client's
// count of its channel is behind) resynchronise from it and pay once more.
// The first payment of a new channel is a deposit (the facilitator sends it
// and pays the gas), every later one a voucher Reeve checks itself. The
// client reads the chain at <rpc url> for a channel it has no state of (a
// new process paying on an old channel).
//
//   REEVE_WALLET_KEY=0x… node batch-tasks.mjs <rpc url> <create url> <session token> <count> <label>
//
// Task i's input is {"n": "<label>-<i>"}. Prints JSON, one entry per task:
// the create's status and task id, the payload type paid with, whether the
// client resynchronised, the PAYMENT-SIGNATURE it sent last (a test sends it
// again) and the paid round trip in ms.
import { x402Client, x402HTTPClient } from "@x402/core/client";
import { toClientEvmSigner } from "@x402/evm";
import { BatchSettlementEvmScheme as BatchClient } from "@x402/evm/batch-settlement/client";
import { createPublicClient, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const [rpcUrl, createUrl, token, count, label] = process.argv.slice(2);
const key = process.env.REEVE_WALLET_KEY;
if (!key || !label) {
  console.error("usage: REEVE_WALLET_KEY=0x… node batch-tasks.mjs <rpc url> <create url> <session token> <count> <label>");
  process.exit(2);
}
const payer = toClientEvmSigner(privateKeyToAccount(key), createPublicClient({ transport: http(rpcUrl) }));
const client = new x402Client().register("eip155:*", new BatchClient(payer));
const httpClient = new x402HTTPClient(client);

/** One create, paid. */
async function create(i) {
  const body = JSON.stringify({ input: { n: `${label}-${i}` } });
  const headers = { "content-type": "application/json", authorization: `Bearer ${token}` };
  const post = (extra) => fetch(createUrl, { method: "POST", headers: { ...headers, ...extra }, body });
  const first = await post({});
  if (first.status !== 402) throw new Error(`expected 402, got ${first.status}: ${await first.text()}`);
  const required = httpClient.getPaymentRequiredResponse((n) => first.headers.get(n), await first.json());
  const started = performance.now();
  let payload = await client.createPaymentPayload(required);
  let signature = httpClient.encodePaymentSignatureHeader(payload);
  let paid = await post(signature);
  const { recovered } = await httpClient.processPaymentResult(payload, (n) => paid.headers.get(n), paid.status);
  if (recovered) {
    payload = await client.createPaymentPayload(required);
    signature = httpClient.encodePaymentSignatureHeader(payload);
    paid = await post(signature);
    await httpClient.processPaymentResult(payload, (n) => paid.headers.get(n), paid.status);
  }
  const ms = Math.round((performance.now() - started) * 10) / 10;
  const answer = await paid.json().catch(() => ({}));
  return {
    status: paid.status,
    id: answer.id,
    code: answer.error?.code,
    type: payload.payload.type,
    recovered,
    header: Object.values(signature)[0],
    ms,
  };
}

const created = [];
for (let i = 0; i < Number(count); i++) created.push(await create(i));
process.stdout.write(`${JSON.stringify(created)}\n`);
