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
import { secp256k1 } from "@noble/curves/secp256k1";
import { base58 } from "@scure/base";
import {
  decodeSignedOffers,
  extractJWSHeader,
  extractOffersFromPaymentRequired,
  findAcceptsObjectFromSignedOffer,
  verifyOfferSignatureJWS,
  verifyReceiptSignatureJWS,
} from "@x402/extensions/offer-receipt";
import { publicKeyToAddress } from "viem/accounts";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = JSON.parse(Buffer.concat(chunks).toString("utf8"));

// The key a JWS's did:key kid names (multicodec 0xe7 0x01, compressed
// secp256k1), as a JWK, and its address. The package's own did:key reader
// (extractPublicKeyFromKid) calls secp256k1.Point, which the @noble/curves
// 1.x its range resolves to lacks; the same decoding, on that version's
// ProjectivePoint, hands the package the key to verify with.
function keyOf(jws) {
  const { kid } = extractJWSHeader(jws);
  const bytes = base58.decode(kid.split("#")[0].replace(/^did:key:z/, ""));
  if (bytes[0] !== 0xe7 || bytes[1] !== 0x01) throw new Error(`not a secp256k1 did:key: ${kid}`);
  const raw = secp256k1.ProjectivePoint.fromHex(bytes.slice(2)).toRawBytes(false);
  const b64 = (b) => Buffer.from(b).toString("base64url");
  const jwk = { kty: "EC", crv: "secp256k1", x: b64(raw.slice(1, 33)), y: b64(raw.slice(33)) };
  return { jwk, signer: publicKeyToAddress(`0x${Buffer.from(raw).toString("hex")}`) };
}

async function check(verify, signed) {
  try {
    const { jwk, signer } = keyOf(signed.signature);
    const payload = await verify(signed, jwk);
    return { ok: true, signer, payload };
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
