// The official batch-settlement buyer asking Reeve for a cooperative refund
// of its channel: @x402/evm's batch-settlement client's `refund(url)`
// (refundChannel), unchanged. It asks <refund url> with GET, reads the
// batch-settlement offer from the 402, and asks again with a `refund`
// payload (a voucher of what the channel was charged); after a corrective
// 402 (its count of the channel is behind, as it is in a new process) it
// resynchronises from it and asks once more. The client reads the chain at
// <rpc url> for a channel it has no state of.
//
//   REEVE_WALLET_KEY=0x… node batch-refund.mjs <rpc url> <refund url> [amount]
//
// Prints JSON: the settle response it returned (`settled`) or the error it
// threw (`error`), and the PAYMENT-SIGNATURE it sent last (`header`: a test
// sends it again).
import { toClientEvmSigner } from "@x402/evm";
import { BatchSettlementEvmScheme as BatchClient } from "@x402/evm/batch-settlement/client";
import { createPublicClient, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const [rpcUrl, refundUrl, amount] = process.argv.slice(2);
const key = process.env.REEVE_WALLET_KEY;
if (!key || !refundUrl) {
  console.error("usage: REEVE_WALLET_KEY=0x… node batch-refund.mjs <rpc url> <refund url> [amount]");
  process.exit(2);
}
const payer = toClientEvmSigner(privateKeyToAccount(key), createPublicClient({ transport: http(rpcUrl) }));
const client = new BatchClient(payer);

// The client's own fetch, watched: what it sent last, and each answer's status.
let header;
const statuses = [];
const watched = async (url, init) => {
  const sent = init?.headers?.["PAYMENT-SIGNATURE"] ?? init?.headers?.["payment-signature"];
  if (sent) header = sent;
  const answer = await fetch(url, init);
  statuses.push(answer.status);
  return answer;
};

let out;
try {
  const settled = await client.refund(refundUrl, { fetch: watched, ...(amount ? { amount } : {}) });
  out = { settled };
} catch (e) {
  out = { error: String(e?.message ?? e) };
}
process.stdout.write(`${JSON.stringify({ ...out, header, statuses })}\n`);
