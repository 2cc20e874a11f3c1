// The official batch-settlement buyer, answering one 402: @x402/core's
// client with @x402/evm's batch-settlement client reads the base64
// PAYMENT-REQUIRED header <required>, picks its batch-settlement offer and
// prints the PAYMENT-SIGNATURE header it would send (base64), as
// @x402/fetch does. A new channel's first payment is a deposit (an ERC-3009
// authorization) with its first voucher; nothing is sent to a chain here.
//
//   REEVE_WALLET_KEY=0x… node batch-pay.mjs <required>
//
// Tests use it to check that Reeve's offer is one the official client pays,
// and with what channel terms.
import { x402Client, x402HTTPClient } from "@x402/core/client";
import { toClientEvmSigner } from "@x402/evm";
import { BatchSettlementEvmScheme as BatchClient } from "@x402/evm/batch-settlement/client";
import { privateKeyToAccount } from "viem/accounts";

const [required] = process.argv.slice(2);
const key = process.env.REEVE_WALLET_KEY;
if (!required || !key) {
  console.error("usage: REEVE_WALLET_KEY=0x… node batch-pay.mjs <PAYMENT-REQUIRED header>");
  process.exit(2);
}
const payer = toClientEvmSigner(privateKeyToAccount(key));
const client = new x402Client().register("eip155:*", new BatchClient(payer));
const http = new x402HTTPClient(client);
const paymentRequired = http.getPaymentRequiredResponse((name) => (name.toLowerCase() === "payment-required" ? required : null));
const payload = await client.createPaymentPayload(paymentRequired);
const headers = http.encodePaymentSignatureHeader(payload);
process.stdout.write(headers["PAYMENT-SIGNATURE"] ?? headers["payment-signature"] ?? Object.values(headers)[0]);
