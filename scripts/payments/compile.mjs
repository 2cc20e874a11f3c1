// Compiles the local chain's contracts offline with solc-js (imports resolve
// into node_modules) and prints {token, uptoProxy, batchSettlement,
// depositCollector}, each {abi, bytecode}, as JSON on stdout.
//
// The upto proxy must answer exactly as @x402/evm expects of
// x402UptoPermit2Proxy, since its clients and facilitator encode their calls
// from that published ABI: every function, event and error of it must be in
// the compiled ABI with the same signature, or compiling fails. The same
// holds of the batch-settlement escrow against the pinned copy of the ABI
// the package calls it with (batch-settlement-abi.json; batch-check.mjs
// checks the copy against the package).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { x402UptoPermit2ProxyABI } from "@x402/evm";
import { pinnedBatchSettlementAbi } from "./batch-abi.mjs";
import { formatAbiItem } from "viem/utils";

const here = dirname(fileURLToPath(import.meta.url));
const solc = createRequire(import.meta.url)("solc");

const contracts = {
  "Token.sol": "Token",
  "UptoPermit2Proxy.sol": "UptoPermit2Proxy",
  "BatchSettlement.sol": "BatchSettlement",
  "ERC3009DepositCollector.sol": "ERC3009DepositCollector",
};
const input = {
  language: "Solidity",
  sources: Object.fromEntries(
    Object.keys(contracts).map((file) => [file, { content: readFileSync(join(here, file), "utf8") }]),
  ),
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: "cancun",
    outputSelection: Object.fromEntries(
      Object.entries(contracts).map(([file, name]) => [file, { [name]: ["abi", "evm.bytecode.object"] }]),
    ),
  },
};
const findImports = (path) => {
  try {
    return { contents: readFileSync(join(here, "node_modules", path), "utf8") };
  } catch {
    return { error: `not found: ${path}` };
  }
};
const out = JSON.parse(solc.compile(JSON.stringify(input), { import: findImports }));
const errors = (out.errors ?? []).filter((e) => e.severity === "error");
if (errors.length) {
  for (const e of errors) console.error(e.formattedMessage);
  process.exit(1);
}
const built = (file) => {
  const c = out.contracts[file][contracts[file]];
  return { abi: c.abi, bytecode: `0x${c.evm.bytecode.object}` };
};
const token = built("Token.sol");
const uptoProxy = built("UptoPermit2Proxy.sol");
const batchSettlement = built("BatchSettlement.sol");
const depositCollector = built("ERC3009DepositCollector.sol");

// A function's outputs and mutability matter to its callers as much as its
// inputs; the signature covers the inputs, the rest is compared alongside.
const shape = (item) =>
  `${item.type} ${formatAbiItem(item)} -> ${(item.outputs ?? []).map((o) => o.type).join(",")} ${item.stateMutability ?? ""}`;
const matches = (contract, file, expected, name) => {
  const compiled = new Set(contract.abi.filter((i) => i.type !== "constructor").map(shape));
  const missing = expected.map(shape).filter((s) => !compiled.has(s));
  if (!missing.length) return true;
  console.error(`${file} does not match ${name}; missing or different:`);
  for (const m of missing) console.error(`  ${m}`);
  return false;
};
const ok = [
  matches(uptoProxy, "UptoPermit2Proxy.sol", x402UptoPermit2ProxyABI, "@x402/evm's x402UptoPermit2ProxyABI"),
  matches(batchSettlement, "BatchSettlement.sol", pinnedBatchSettlementAbi(), "batch-settlement-abi.json"),
].every(Boolean);
if (!ok) process.exit(1);

process.stdout.write(JSON.stringify({ token, uptoProxy, batchSettlement, depositCollector }));
