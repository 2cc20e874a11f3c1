// One buyer and one seller paying by x402's `batch-settlement` scheme, end
// to end, with the official packages on every side: @x402/core's HTTP
// client with @x402/evm's batch-settlement client (the buyer), @x402/core's
// HTTP resource server with @x402/evm's batch-settlement server (a seller
// selling one request at a time), and the facilitator at <facilitator url>
// (scripts/payments/facilitator.mjs) settling on the local chain.
//
//   REEVE_WALLET_KEY=0x… node batch-flow.mjs <facilitator url> <pay to> <price> <requests> <deposit>
//
// The seller asks for deposits of at least <deposit> (its 402's
// `minDeposit`). The buyer's first request deposits that into a channel (an
// ERC-3009 authorization; the facilitator sends it and pays the gas), and
// so does the first request the channel's balance no longer covers; every
// other request is paid by a voucher the seller checks itself. Then
// the seller claims every voucher and settles in its own transactions
// through the facilitator, and the buyer asks for the rest back (a
// cooperative refund the seller's receiver authorizer signs). It prints what
// happened as JSON: the test reads the chain itself to check that the books
// balance. The HTTP glue here (a node:http adapter, a fetch loop) is what
// @x402/express and @x402/fetch do; the payment logic is all the packages'.
import { createServer } from "node:http";
import { x402Client, x402HTTPClient } from "@x402/core/client";
import { HTTPFacilitatorClient, x402HTTPResourceServer, x402ResourceServer } from "@x402/core/server";
import { toClientEvmSigner } from "@x402/evm";
import { BatchSettlementEvmScheme as BatchClient } from "@x402/evm/batch-settlement/client";
import { BatchSettlementEvmScheme as BatchServer } from "@x402/evm/batch-settlement/server";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";

const NETWORK = "eip155:84532";
const TOKEN = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";

const [facilitatorUrl, payTo, price, requests, deposit] = process.argv.slice(2);
const key = process.env.REEVE_WALLET_KEY;
if (!key || !deposit) {
  console.error("usage: REEVE_WALLET_KEY=0x… node batch-flow.mjs <facilitator url> <pay to> <price> <requests> <deposit>");
  process.exit(2);
}

// ---------------------------------------------------------------- the seller
// Its receiver authorizer is a key of its own: it signs the claims and the
// refunds the facilitator sends (the local facilitator offers none).
const authorizer = privateKeyToAccount(generatePrivateKey());
const scheme = new BatchServer(payTo, { receiverAuthorizerSigner: authorizer });
const facilitator = new HTTPFacilitatorClient({ url: facilitatorUrl });
const resourceServer = new x402ResourceServer(facilitator).register(NETWORK, scheme);
const routes = {
  "GET /work": {
    accepts: {
      scheme: "batch-settlement",
      network: NETWORK,
      payTo,
      price: { amount: price, asset: TOKEN, extra: { name: "USDC", version: "2" } },
      extra: { minDeposit: deposit },
    },
    description: "one unit of work",
  },
};
const http = new x402HTTPResourceServer(resourceServer, routes);
await http.initialize();

const send = (res, status, headers, body) => {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body ?? {}));
};
const server = createServer(async (req, res) => {
  const url = new URL(req.url, "http://localhost");
  const header = (name) => req.headers[name.toLowerCase()];
  const adapter = {
    getHeader: (name) => header(name),
    getMethod: () => req.method,
    getPath: () => url.pathname,
    getUrl: () => url.href,
    getAcceptHeader: () => header("accept") ?? "",
    getUserAgent: () => header("user-agent") ?? "",
  };
  const context = {
    adapter,
    path: url.pathname,
    decodedPath: url.pathname,
    method: req.method,
    paymentHeader: header("payment-signature"),
  };
  try {
    const result = await http.processHTTPRequest(context);
    if (result.type === "payment-error") return send(res, result.response.status, result.response.headers, result.response.body);
    if (result.type === "no-payment-required") return send(res, 404, {}, {});
    const body = Buffer.from(JSON.stringify({ done: true }));
    const settled = await http.processSettlement(
      result.paymentPayload,
      result.paymentRequirements,
      result.declaredExtensions,
      { request: context, responseBody: body, responseHeaders: { "content-type": "application/json" } },
      undefined,
      result.beforeHandlerSettlement,
    );
    if (!settled.success) return send(res, settled.response.status, settled.response.headers, settled.response.body);
    res.writeHead(200, { "content-type": "application/json", ...settled.headers });
    res.end(body);
  } catch (e) {
    console.error(e);
    send(res, 500, {}, { error: "internal" });
  }
});
await new Promise((ready) => server.listen(0, "127.0.0.1", ready));
const workUrl = `http://127.0.0.1:${server.address().port}/work`;

// ----------------------------------------------------------------- the buyer
const payer = toClientEvmSigner(privateKeyToAccount(key));
const batch = new BatchClient(payer);
const client = new x402Client()
  .register(NETWORK, batch)
  .setSpendControls({ allowedAssets: [{ network: NETWORK, asset: TOKEN }] });
const httpClient = new x402HTTPClient(client);

/** One paid GET, as @x402/fetch pays: 402, pay, retry once after a corrective 402. */
async function paidGet() {
  const first = await fetch(workUrl);
  if (first.status !== 402) throw new Error(`expected 402, got ${first.status}`);
  const required = httpClient.getPaymentRequiredResponse((n) => first.headers.get(n), await first.json().catch(() => undefined));
  const started = performance.now();
  let payload = await client.createPaymentPayload(required);
  let paid = await fetch(workUrl, { headers: httpClient.encodePaymentSignatureHeader(payload) });
  const { recovered } = await httpClient.processPaymentResult(payload, (n) => paid.headers.get(n), paid.status);
  if (recovered) {
    payload = await client.createPaymentPayload(required);
    paid = await fetch(workUrl, { headers: httpClient.encodePaymentSignatureHeader(payload) });
    await httpClient.processPaymentResult(payload, (n) => paid.headers.get(n), paid.status);
  }
  if (paid.status !== 200) throw new Error(`a paid request answered ${paid.status}: ${await paid.text()}`);
  return { type: payload.payload.type, ms: performance.now() - started, channelId: payload.payload.voucher.channelId };
}

const paid = [];
for (let i = 0; i < Number(requests); i++) paid.push(await paidGet());

// ------------------------------------------- the seller claims and settles
const manager = scheme.createChannelManager(facilitator, NETWORK, TOKEN);
const { claims, settle } = await manager.claimAndSettle();

// ---------------------------------------------------- the buyer's refund
const refund = await batch.refund(workUrl).catch((e) => ({ success: false, errorReason: String(e) }));

server.close();
const round = (ms) => Math.round(ms * 10) / 10;
process.stdout.write(
  `${JSON.stringify({
    channelId: paid[0]?.channelId,
    payments: paid.map((p) => ({ type: p.type, ms: round(p.ms) })),
    claims,
    settle,
    refund: { success: refund.success, transaction: refund.transaction, errorReason: refund.errorReason },
  })}\n`,
);
