// Checks Reeve's signed offers and receipts with the official x402
// TypeScript package (@x402/extensions' offer-receipt), as a buyer would:
// the shared/tests/suite/receipts.rs tests run it.
//
// stdin: {"paymentRequired": <a 402 body>?, "receipts": [<settlement response
// or signed receipt>, ...]}. stdout: one JSON line,
//   {"offers": [{ok, signer, payload, accepts} | {ok: false, error}],
//    "receipts": [{ok, signer, payload} | {ok: false, error}]}
// where `signer` is the Ethereum address of the key the JWS `kid` names
// (did:key), which a buyer compares with the seller's published address.
import {
  decodeSignedOffers,
  extractJWSHeader,
  extractOffersFromPaymentRequired,
  extractPublicKeyFromKid,
  findAcceptsObjectFromSignedOffer,
  verifyOfferSignatureJWS,
  verifyReceiptSignatureJWS,
} from "@x402/extensions/offer-receipt";
import { exportJWK } from "jose";
import { publicKeyToAddress } from "viem/accounts";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = JSON.parse(Buffer.concat(chunks).toString("utf8"));

// The address of the key a JWS's kid names.
async function signerOf(jws) {
  const { kid } = extractJWSHeader(jws);
  const jwk = await exportJWK(await extractPublicKeyFromKid(kid));
  const hex = (b64) => Buffer.from(b64, "base64url").toString("hex");
  return publicKeyToAddress(`0x04${hex(jwk.x)}${hex(jwk.y)}`);
}

async function check(verify, signed) {
  try {
    const payload = await verify(signed);
    return { ok: true, signer: await signerOf(signed.signature), payload };
  } catch (error) {
    return { ok: false, error: String(error?.message ?? error) };
  }
}

const out = { offers: [], receipts: [] };
if (input.paymentRequired) {
  const signed = extractOffersFromPaymentRequired(input.paymentRequired);
  const decoded = decodeSignedOffers(signed);
  for (const [i, offer] of signed.entries()) {
    const result = await check(verifyOfferSignatureJWS, offer);
    if (result.ok) {
      result.accepts = findAcceptsObjectFromSignedOffer(decoded[i], input.paymentRequired.accepts) ?? null;
    }
    out.offers.push(result);
  }
}
for (const item of input.receipts ?? []) {
  // A settlement response carries it in extensions["offer-receipt"].
  const receipt = item?.extensions?.["offer-receipt"]?.info?.receipt ?? item;
  out.receipts.push(await check(verifyReceiptSignatureJWS, receipt));
}
process.stdout.write(`${JSON.stringify(out)}\n`);
