// A thin x402 facilitator for the local chain: the official @x402/core
// facilitator with @x402/evm's `exact` scheme (EIP-3009), its `upto` scheme
// (Permit2, through the upto proxy deploy.mjs placed) and its
// `batch-settlement` scheme (the escrow and ERC-3009 deposit collector
// deploy.mjs placed), settling from anvil's account 0. It declares the
// eip2612GasSponsoring extension: an upto payer that never approved Permit2
// may sign the token's EIP-2612 permit instead, and the settlement applies
// it (settleWithPermit), so the payer spends no gas.
//
//   node facilitator.mjs <rpc url> <bind host> <port> [account] [confirmation ms]
//
// A test that runs a facilitator of its own (to stop it) names another of
// anvil's accounts to pay the gas from: two facilitators sending from one
// account would pick the same transaction nonces. It may also shorten how
// long a settle waits for its receipt before it answers `settlement_pending`
// with the hash it broadcast (@x402/evm's default is 180000 ms).
//
// POST /verify and POST /settle take {x402Version, paymentPayload,
// paymentRequirements}; GET /supported lists what it settles (for upto, with
// the address a payer must name as its facilitator). An upto settle takes
// the amount to charge as paymentRequirements.amount, at most the signed
// ceiling; 0 charges nothing and sends no transaction. A batch-settlement
// settle is a deposit (the payer's ERC-3009 authorization, gas paid here),
// a claim, a settle or a refund; the claims and refunds carry the seller's
// own receiver-authorizer signatures: this facilitator offers no authorizer
// key of its own (it has no way to tell a seller's refund request from
// anyone else's), so `/supported` names no `receiverAuthorizer`.
// Everything the protocol checks is x402's own code; this file only does
// HTTP.
import { createServer } from "node:http";
import { x402Facilitator } from "@x402/core/facilitator";
import { toFacilitatorEvmSigner } from "@x402/evm";
import { registerExactEvmScheme } from "@x402/evm/exact/facilitator";
import { BatchSettlementEvmScheme } from "@x402/evm/batch-settlement/facilitator";
import { UptoEvmScheme } from "@x402/evm/upto/facilitator";
import { createWalletClient, defineChain, http, publicActions } from "viem";
import { mnemonicToAccount } from "viem/accounts";

const [rpc, host, port, accountIndex = "0", confirmationMs] = process.argv.slice(2);
const NETWORK = "eip155:84532";
// anvil mines a block a second (scripts/payments.sh), as Base does.
const BLOCK_MS = 1000;
const chain = defineChain({
  id: 84532,
  name: "reeve-local",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [rpc] } },
  blockTime: BLOCK_MS,
});
// anvil's development mnemonic; account 0 (unless told otherwise) pays the
// gas of every settlement.
const account = mnemonicToAccount("test test test test test test test test test test test junk", { addressIndex: Number(accountIndex) });
// A settle answers once its receipt is read, and the receipt is looked for
// each time the client polls the block number. viem polls every 4 s for a
// chain it does not know (so every local `exact` settle took ~4 s); a tenth
// of a block keeps the wait within ~100 ms of the block that mines it, at
// ten eth_blockNumber calls a second on loopback while a settle waits.
const POLL_MS = BLOCK_MS / 10;
const client = createWalletClient({ account, chain, transport: http(rpc), pollingInterval: POLL_MS }).extend(publicActions);
const signer = toFacilitatorEvmSigner(
  { ...client, address: account.address },
  confirmationMs ? { confirmationTimeoutMs: Number(confirmationMs) } : {},
);

const facilitator = new x402Facilitator();
registerExactEvmScheme(facilitator, { signer, networks: NETWORK });
facilitator.register(NETWORK, new UptoEvmScheme(signer));
facilitator.register(NETWORK, new BatchSettlementEvmScheme(signer));
// Needs no signer of its own: the scheme's signer sends settleWithPermit.
facilitator.registerExtension({ key: "eip2612GasSponsoring" });

// Settlements go out one at a time: they all spend account 0's nonces, and
// two built concurrently would pick the same one.
let settling = Promise.resolve();
const serially = (work) => {
  const run = settling.then(work, work);
  settling = run.catch(() => {});
  return run;
};

const json = (res, status, body) => {
  const text = JSON.stringify(body, (_, v) => (typeof v === "bigint" ? v.toString() : v));
  res.writeHead(status, { "content-type": "application/json" });
  res.end(text);
};

async function readJson(req) {
  const chunks = [];
  let size = 0;
  for await (const c of req) {
    size += c.length;
    if (size > 1 << 20) throw new Error("body too large");
    chunks.push(c);
  }
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

createServer(async (req, res) => {
  try {
    if (req.method === "GET" && req.url === "/supported") return json(res, 200, facilitator.getSupported());
    if (req.method === "POST" && (req.url === "/verify" || req.url === "/settle")) {
      let body;
      try {
        body = await readJson(req);
      } catch {
        return json(res, 400, { error: "the body must be JSON" });
      }
      const { paymentPayload, paymentRequirements } = body ?? {};
      if (!paymentPayload || !paymentRequirements) {
        return json(res, 400, { error: "paymentPayload and paymentRequirements are required" });
      }
      const result = req.url === "/verify"
        ? await facilitator.verify(paymentPayload, paymentRequirements)
        : await serially(() => facilitator.settle(paymentPayload, paymentRequirements));
      console.log(`${req.url} ${JSON.stringify({ ok: result.isValid ?? result.success, reason: result.invalidReason ?? result.errorReason, tx: result.transaction })}`);
      return json(res, 200, result);
    }
    if (req.method === "GET" && req.url === "/health") return json(res, 200, { ok: true });
    return json(res, 404, { error: "not found" });
  } catch (e) {
    // x402 throws typed errors (VerifyError/SettleError) carrying a response.
    if (e && typeof e === "object" && "isValid" in e) return json(res, 200, { isValid: false, invalidReason: e.invalidReason, invalidMessage: e.invalidMessage, payer: e.payer });
    if (e && typeof e === "object" && "errorReason" in e) return json(res, 200, { success: false, errorReason: e.errorReason, errorMessage: e.errorMessage, payer: e.payer, transaction: e.transaction ?? "", network: e.network ?? NETWORK });
    console.error(e);
    return json(res, 500, { error: "internal error" });
  }
}).listen(Number(port), host, () => console.log(`facilitator on http://${host}:${port} (${NETWORK}, settling from ${account.address})`));
