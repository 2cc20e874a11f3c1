// Puts the test token on the local chain at the catalog's address and funds
// anvil's default accounts 1..9 with 1,000 tokens each.
//
//   node deploy.mjs <rpc url> <token address> <compiled token json>
//
// The token is deployed normally (so its constructor fills the immutables),
// then its runtime code is copied to the catalog's address with
// anvil_setCode. Idempotent: a second run tops nobody up twice.
import { readFileSync } from "node:fs";
import { createPublicClient, createWalletClient, defineChain, http, parseUnits } from "viem";
import { mnemonicToAccount } from "viem/accounts";

const [rpc, tokenAddress, compiled] = process.argv.slice(2);
const { abi, bytecode } = JSON.parse(readFileSync(compiled, "utf8"));
const chain = defineChain({
  id: 84532,
  name: "reeve-local",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [rpc] } },
});
// anvil's well-known development mnemonic: these keys hold no real value.
const MNEMONIC = "test test test test test test test test test test test junk";
const deployer = mnemonicToAccount(MNEMONIC, { addressIndex: 0 });
const pub = createPublicClient({ chain, transport: http(rpc) });
const wallet = createWalletClient({ account: deployer, chain, transport: http(rpc) });

const existing = await pub.getCode({ address: tokenAddress });
if (!existing || existing === "0x") {
  const hash = await wallet.deployContract({ abi, bytecode });
  const { contractAddress } = await pub.waitForTransactionReceipt({ hash });
  const runtime = await pub.getCode({ address: contractAddress });
  await pub.request({ method: "anvil_setCode", params: [tokenAddress, runtime] });
}

const FUNDING = parseUnits("1000", 6);
for (let i = 1; i <= 9; i++) {
  const { address } = mnemonicToAccount(MNEMONIC, { addressIndex: i });
  const balance = await pub.readContract({ address: tokenAddress, abi, functionName: "balanceOf", args: [address] });
  if (balance === 0n) {
    const hash = await wallet.writeContract({ address: tokenAddress, abi, functionName: "mint", args: [address, FUNDING] });
    await pub.waitForTransactionReceipt({ hash });
  }
}
const name = await pub.readContract({ address: tokenAddress, abi, functionName: "name" });
console.log(`token ${name} at ${tokenAddress}; accounts 1-9 funded`);
