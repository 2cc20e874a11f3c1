// Pays a Reeve 402 with the official TypeScript x402 client (@x402/core's
// x402Client with @x402/evm's exact and upto schemes), as a Node buyer would.
//
//   REEVE_WALLET_KEY=0x… node pay.mjs [rpc url] < challenge.json  →  PAYMENT-SIGNATURE value
//
// The twin of pay.py: it reads the 402 challenge (its JSON body, or the
// base64 PAYMENT-REQUIRED header value) on stdin and prints the header value
// to send. Only the local chain (eip155:84532) is registered. The local token
// is none of the SDK's known assets, so spend controls name it explicitly
// (what a buyer of a non-default token has to do). Given the chain's RPC
// URL, the upto client can read the payer's Permit2 allowance and sign the
// token's EIP-2612 permit when the 402 offers gas sponsoring. The key comes
// from the environment, never from an argument.
import { x402Client } from "@x402/core/client";
import { decodePaymentRequiredHeader, encodePaymentSignatureHeader } from "@x402/core/http";
import { toClientEvmSigner } from "@x402/evm";
import { ExactEvmScheme } from "@x402/evm/exact/client";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { createPublicClient, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const NETWORK = "eip155:84532";
const TOKEN = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";

const key = process.env.REEVE_WALLET_KEY;
if (!key) {
  console.error("REEVE_WALLET_KEY is not set");
  process.exit(2);
}
const [rpc] = process.argv.slice(2);
const account = privateKeyToAccount(key);
const signer = toClientEvmSigner(account, rpc ? createPublicClient({ transport: http(rpc) }) : undefined);

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const text = Buffer.concat(chunks).toString("utf8").trim();
const required = text.startsWith("{") ? JSON.parse(text) : decodePaymentRequiredHeader(text);

const client = new x402Client()
  .register(NETWORK, new ExactEvmScheme(signer))
  .register(NETWORK, new UptoEvmScheme(signer))
  .setSpendControls({ allowedAssets: [{ network: NETWORK, asset: TOKEN }] });
const payload = await client.createPaymentPayload(required);
process.stdout.write(`${encodePaymentSignatureHeader(payload)}\n`);
