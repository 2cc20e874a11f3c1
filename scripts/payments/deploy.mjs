// Puts the contracts x402 settles through on the local chain, each at the
// address a real client or facilitator names, and funds anvil's default
// accounts 1..9 with 1,000 test tokens each.
//
//   node deploy.mjs <rpc url> <token address> <compiled json from compile.mjs>
//
//   Permit2      its canonical address: the runtime hex Uniswap ships for
//                exactly this (@uniswap/v4-periphery, DeployPermit2.sol). A
//                rebuild from source is not byte-identical, so the hex is used
//                as shipped. It was built on chain 31337 and recomputes its
//                EIP-712 domain on any other chain id, which is checked below.
//   Multicall3   its canonical address, from viem's creation code: the
//                facilitator reads balance and allowance through it to say why
//                an upto payment would fail.
//   upto proxy   UptoPermit2Proxy.sol, deployed pointing at Permit2, its
//                runtime code copied to @x402/evm's x402UptoPermit2ProxyAddress.
//   batch        BatchSettlement.sol at @x402/evm's BATCH_SETTLEMENT_ADDRESS,
//   settlement   and ERC3009DepositCollector.sol, deployed pointing at it, at
//                its ERC3009_DEPOSIT_COLLECTOR_ADDRESS.
//   token        Token.sol at the catalog's address.
//
// A contract is deployed normally (so its constructor fills the immutables),
// then its runtime code is copied with anvil_setCode. Idempotent: a second
// run changes nothing, and a chain that holds an older token (without
// EIP-2612 permit or ERC-3009 receiveWithAuthorization) gets the new code
// with its balances kept.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import {
  BATCH_SETTLEMENT_ADDRESS,
  BATCH_SETTLEMENT_DOMAIN,
  ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
  PERMIT2_ADDRESS,
  uptoPermit2WitnessTypes,
  voucherTypes,
  x402UptoPermit2ProxyAddress,
} from "@x402/evm";
import { computeChannelId } from "@x402/evm/batch-settlement/client";
import {
  createPublicClient,
  createWalletClient,
  defineChain,
  encodeDeployData,
  hashDomain,
  hashTypedData,
  http,
  keccak256,
  parseUnits,
  toHex,
} from "viem";
import { mnemonicToAccount } from "viem/accounts";
import { baseSepolia } from "viem/chains";

const [rpc, tokenAddress, compiled] = process.argv.slice(2);
const { token, uptoProxy, batchSettlement, depositCollector } = JSON.parse(readFileSync(compiled, "utf8"));
const here = dirname(fileURLToPath(import.meta.url));
const CHAIN_ID = 84532;
const chain = defineChain({
  id: CHAIN_ID,
  name: "reeve-local",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [rpc] } },
});
// anvil's well-known development mnemonic: these keys hold no real value.
const MNEMONIC = "test test test test test test test test test test test junk";
const deployer = mnemonicToAccount(MNEMONIC, { addressIndex: 0 });
// anvil mines a block a second; viem would poll for receipts every 4 s.
const pub = createPublicClient({ chain, transport: http(rpc), pollingInterval: 200 });
const wallet = createWalletClient({ account: deployer, chain, transport: http(rpc) });
const MULTICALL3_ADDRESS = baseSepolia.contracts.multicall3.address;
// viem keeps Multicall3's creation code (for its deployless calls) in a
// module its package exports do not name, so it is imported by path.
const { multicall3Bytecode } = await import(pathToFileURL(join(here, "node_modules/viem/_esm/constants/contracts.js")).href);

const codeAt = async (address) => (await pub.getCode({ address })) ?? "0x";
const setCode = (address, code) => pub.request({ method: "anvil_setCode", params: [address, code] });
const fail = (message) => {
  console.error(`deploy.mjs: ${message}`);
  process.exit(1);
};

/** Deploys creation code and copies the runtime code it leaves to `address`. */
async function placeDeployed(address, data) {
  const hash = await wallet.sendTransaction({ data });
  const { contractAddress, status } = await pub.waitForTransactionReceipt({ hash });
  if (status !== "success") fail(`deploying the code for ${address} reverted`);
  await setCode(address, await codeAt(contractAddress));
}

// Permit2, as Uniswap ships it.
const permit2Source = readFileSync(
  join(here, "node_modules/@uniswap/v4-periphery/lib/permit2/test/utils/DeployPermit2.sol"),
  "utf8",
);
const permit2Hex = permit2Source.match(/hex"([0-9a-fA-F]+)"/)?.[1];
if (!permit2Hex) fail("no Permit2 bytecode in @uniswap/v4-periphery's DeployPermit2.sol");
if ((await codeAt(PERMIT2_ADDRESS)).toLowerCase() !== `0x${permit2Hex.toLowerCase()}`) {
  await setCode(PERMIT2_ADDRESS, `0x${permit2Hex}`);
}
const permit2Domain = await pub.readContract({
  address: PERMIT2_ADDRESS,
  abi: [{ type: "function", name: "DOMAIN_SEPARATOR", inputs: [], outputs: [{ type: "bytes32" }], stateMutability: "view" }],
  functionName: "DOMAIN_SEPARATOR",
});
const expectedDomain = hashDomain({
  domain: { name: "Permit2", chainId: CHAIN_ID, verifyingContract: PERMIT2_ADDRESS },
  types: { EIP712Domain: [{ name: "name", type: "string" }, { name: "chainId", type: "uint256" }, { name: "verifyingContract", type: "address" }] },
});
if (permit2Domain !== expectedDomain) fail(`Permit2's EIP-712 domain is not chain ${CHAIN_ID}'s: signatures would not verify`);

// Multicall3, from viem's creation code.
if ((await codeAt(MULTICALL3_ADDRESS)) === "0x") await placeDeployed(MULTICALL3_ADDRESS, multicall3Bytecode);

// The upto proxy, pointing at Permit2.
if ((await codeAt(x402UptoPermit2ProxyAddress)) === "0x") {
  await placeDeployed(
    x402UptoPermit2ProxyAddress,
    encodeDeployData({ abi: uptoProxy.abi, bytecode: uptoProxy.bytecode, args: [PERMIT2_ADDRESS] }),
  );
}
const read = (functionName) => pub.readContract({ address: x402UptoPermit2ProxyAddress, abi: uptoProxy.abi, functionName });
// The witness the clients sign, as @x402/evm publishes it, must be the one
// the proxy hashes, or Permit2 refuses every upto signature.
const witness = uptoPermit2WitnessTypes.Witness.map((f) => `${f.type} ${f.name}`).join(",");
if ((await read("WITNESS_TYPEHASH")) !== keccak256(toHex(`Witness(${witness})`))) {
  fail("the upto proxy's witness is not the one @x402/evm's clients sign");
}
if ((await read("PERMIT2")).toLowerCase() !== PERMIT2_ADDRESS.toLowerCase()) fail("the upto proxy does not point at Permit2");

// The batch-settlement escrow and its ERC-3009 deposit collector, which
// only the escrow may call.
if ((await codeAt(BATCH_SETTLEMENT_ADDRESS)) === "0x") {
  await placeDeployed(BATCH_SETTLEMENT_ADDRESS, encodeDeployData({ abi: batchSettlement.abi, bytecode: batchSettlement.bytecode }));
}
if ((await codeAt(ERC3009_DEPOSIT_COLLECTOR_ADDRESS)) === "0x") {
  await placeDeployed(
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    encodeDeployData({ abi: depositCollector.abi, bytecode: depositCollector.bytecode, args: [BATCH_SETTLEMENT_ADDRESS] }),
  );
}
const escrow = (functionName, args) =>
  pub.readContract({ address: BATCH_SETTLEMENT_ADDRESS, abi: batchSettlement.abi, functionName, args });
// The channel id and the voucher the clients compute from @x402/evm's
// domain and types must be the ones the escrow hashes, or every deposit
// lands in a channel nobody names and every voucher is refused.
const sample = {
  payer: deployer.address,
  payerAuthorizer: deployer.address,
  receiver: deployer.address,
  receiverAuthorizer: deployer.address,
  token: tokenAddress,
  withdrawDelay: 900,
  salt: keccak256(toHex("reeve")),
};
const channelId = computeChannelId(sample, CHAIN_ID);
if ((await escrow("getChannelId", [sample])) !== channelId) fail("the escrow's channel id is not the one @x402/evm computes");
const voucher = hashTypedData({
  domain: { ...BATCH_SETTLEMENT_DOMAIN, chainId: CHAIN_ID, verifyingContract: BATCH_SETTLEMENT_ADDRESS },
  types: voucherTypes,
  primaryType: "Voucher",
  message: { channelId, maxClaimableAmount: 1n },
});
if ((await escrow("getVoucherDigest", [channelId, 1n])) !== voucher) fail("the escrow's voucher is not the one @x402/evm's clients sign");
const collectorEscrow = await pub.readContract({
  address: ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
  abi: depositCollector.abi,
  functionName: "x402BatchSettlement",
});
if (collectorEscrow.toLowerCase() !== BATCH_SETTLEMENT_ADDRESS.toLowerCase()) fail("the deposit collector does not point at the escrow");

// The token. An older one, without EIP-2612 permit (nonces) or ERC-3009's
// receiveWithAuthorization, answers one of these with a revert, and gets the
// new code (the storage layout only grew at its end).
const answers = (functionName, args) =>
  pub.readContract({ address: tokenAddress, abi: token.abi, functionName, args }).then(() => true, () => false);
const current = (await answers("nonces", [deployer.address])) && (await answers("RECEIVE_WITH_AUTHORIZATION_TYPEHASH", []));
if (!current) await placeDeployed(tokenAddress, encodeDeployData({ abi: token.abi, bytecode: token.bytecode }));

// The mints go out together, with consecutive nonces, and share a block.
const FUNDING = parseUnits("1000", 6);
let nonce = await pub.getTransactionCount({ address: deployer.address, blockTag: "pending" });
const mints = [];
for (let i = 1; i <= 9; i++) {
  const { address } = mnemonicToAccount(MNEMONIC, { addressIndex: i });
  const balance = await pub.readContract({ address: tokenAddress, abi: token.abi, functionName: "balanceOf", args: [address] });
  if (balance === 0n) {
    const args = [address, FUNDING];
    mints.push(await wallet.writeContract({ address: tokenAddress, abi: token.abi, functionName: "mint", args, nonce: nonce++ }));
  }
}
for (const hash of mints) {
  if ((await pub.waitForTransactionReceipt({ hash })).status !== "success") fail("a mint reverted");
}
const name = await pub.readContract({ address: tokenAddress, abi: token.abi, functionName: "name" });
console.log(
  `Permit2 at ${PERMIT2_ADDRESS}, Multicall3 at ${MULTICALL3_ADDRESS}, upto proxy at ${x402UptoPermit2ProxyAddress}, ` +
    `batch settlement at ${BATCH_SETTLEMENT_ADDRESS} (ERC-3009 deposits through ${ERC3009_DEPOSIT_COLLECTOR_ADDRESS}); ` +
    `token ${name} (EIP-3009, EIP-2612) at ${tokenAddress}; accounts 1-9 funded`,
);
