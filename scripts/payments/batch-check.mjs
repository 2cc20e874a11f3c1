// Checks the local batch-settlement escrow against @x402/evm, the package
// every client, seller and facilitator uses to call it:
//
//   node batch-check.mjs <rpc url>
//
// - the pinned ABI copy (batch-settlement-abi.json, which compile.mjs builds
//   BatchSettlement.sol against) is, entry for entry, the ABI the package
//   encodes its calls with (not a public export: batch-abi.mjs reads it from
//   the module the package's facilitator imports);
// - at the package's addresses (BATCH_SETTLEMENT_ADDRESS,
//   ERC3009_DEPOSIT_COLLECTOR_ADDRESS) the chain holds the escrow and its
//   collector, and the collector serves that escrow;
// - every EIP-712 hash the escrow checks a signature against is the one the
//   package signs: the channel id (its config type), the voucher
//   (voucherTypes), the refund (refundTypes) and the claim batch
//   (claimBatchTypes), all under BATCH_SETTLEMENT_DOMAIN;
// - the token's ERC-3009 receiveWithAuthorization type is the one the
//   package's deposits sign.
//
// Prints what it checked; exits 1 naming every mismatch.
import { isDeepStrictEqual } from "node:util";
import {
  BATCH_SETTLEMENT_ADDRESS,
  BATCH_SETTLEMENT_DOMAIN,
  ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
  claimBatchTypes,
  refundTypes,
  voucherTypes,
} from "@x402/evm";
import { computeChannelId } from "@x402/evm/batch-settlement/client";
import { createPublicClient, hashTypedData, http, keccak256, toHex } from "viem";
import { packageBatchSettlementAbi, pinnedBatchSettlementAbi } from "./batch-abi.mjs";

const [rpc] = process.argv.slice(2);
const TOKEN = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
const CHAIN_ID = 84532;
const problems = [];
const check = (ok, problem) => {
  if (!ok) problems.push(problem);
};

const pinned = pinnedBatchSettlementAbi();
const called = await packageBatchSettlementAbi();
check(isDeepStrictEqual(pinned, called), "batch-settlement-abi.json is not the ABI @x402/evm calls the escrow with");

const chain = createPublicClient({ transport: http(rpc) });
const escrow = (functionName, args = []) =>
  chain.readContract({ address: BATCH_SETTLEMENT_ADDRESS, abi: called, functionName, args });
const domain = { ...BATCH_SETTLEMENT_DOMAIN, chainId: CHAIN_ID, verifyingContract: BATCH_SETTLEMENT_ADDRESS };

const config = {
  payer: "0x1111111111111111111111111111111111111111",
  payerAuthorizer: "0x2222222222222222222222222222222222222222",
  receiver: "0x3333333333333333333333333333333333333333",
  receiverAuthorizer: "0x4444444444444444444444444444444444444444",
  token: TOKEN,
  withdrawDelay: 86400,
  salt: keccak256(toHex("batch-check")),
};
const channelId = computeChannelId(config, CHAIN_ID);
check((await escrow("getChannelId", [config])) === channelId, "the escrow's channel id differs from @x402/evm's computeChannelId");
check(
  (await escrow("getVoucherDigest", [channelId, 123n])) ===
    hashTypedData({ domain, types: voucherTypes, primaryType: "Voucher", message: { channelId, maxClaimableAmount: 123n } }),
  "the escrow's voucher hash differs from voucherTypes'",
);
check(
  (await escrow("getRefundDigest", [channelId, 7n, 456n])) ===
    hashTypedData({ domain, types: refundTypes, primaryType: "Refund", message: { channelId, nonce: 7n, amount: 456n } }),
  "the escrow's refund hash differs from refundTypes'",
);
const claims = [
  { voucher: { channel: config, maxClaimableAmount: 900n }, signature: "0x", totalClaimed: 800n },
  { voucher: { channel: { ...config, salt: keccak256(toHex("other")) }, maxClaimableAmount: 50n }, signature: "0x", totalClaimed: 50n },
];
const entries = claims.map((c) => ({
  channelId: computeChannelId(c.voucher.channel, CHAIN_ID),
  maxClaimableAmount: c.voucher.maxClaimableAmount,
  totalClaimed: c.totalClaimed,
}));
check(
  (await escrow("getClaimBatchDigest", [claims])) ===
    hashTypedData({ domain, types: claimBatchTypes, primaryType: "ClaimBatch", message: { claims: entries } }),
  "the escrow's claim batch hash differs from claimBatchTypes'",
);
const collectorEscrow = await chain.readContract({
  address: ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
  abi: [{ type: "function", name: "x402BatchSettlement", inputs: [], outputs: [{ type: "address" }], stateMutability: "view" }],
  functionName: "x402BatchSettlement",
});
check(collectorEscrow.toLowerCase() === BATCH_SETTLEMENT_ADDRESS.toLowerCase(), "the deposit collector does not serve the escrow");
const tokenTypehash = await chain.readContract({
  address: TOKEN,
  abi: [{ type: "function", name: "RECEIVE_WITH_AUTHORIZATION_TYPEHASH", inputs: [], outputs: [{ type: "bytes32" }], stateMutability: "view" }],
  functionName: "RECEIVE_WITH_AUTHORIZATION_TYPEHASH",
});
const RECEIVE_TYPE =
  "ReceiveWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)";
check(
  tokenTypehash === keccak256(toHex(RECEIVE_TYPE)),
  "the token's ReceiveWithAuthorization type is not ERC-3009's",
);

if (problems.length) {
  for (const p of problems) console.error(p);
  process.exit(1);
}
console.log(
  `${called.length} ABI entries, channel id, voucher, refund, claim batch and deposit authorization agree with @x402/evm`,
);
