// Compiles the local chain's contracts offline with solc-js (imports resolve
// into node_modules) and prints {token, uptoProxy}, each {abi, bytecode}, as
// JSON on stdout.
//
// The upto proxy must answer exactly as @x402/evm expects of
// x402UptoPermit2Proxy, since its clients and facilitator encode their calls
// from that published ABI: every function, event and error of it must be in
// the compiled ABI with the same signature, or compiling fails.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { x402UptoPermit2ProxyABI } from "@x402/evm";
import { formatAbiItem } from "viem/utils";

const here = dirname(fileURLToPath(import.meta.url));
const solc = createRequire(import.meta.url)("solc");

const contracts = { "Token.sol": "Token", "UptoPermit2Proxy.sol": "UptoPermit2Proxy" };
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

// A function's outputs and mutability matter to its callers as much as its
// inputs; the signature covers the inputs, the rest is compared alongside.
const shape = (item) =>
  `${item.type} ${formatAbiItem(item)} -> ${(item.outputs ?? []).map((o) => o.type).join(",")} ${item.stateMutability ?? ""}`;
const compiled = new Set(uptoProxy.abi.filter((i) => i.type !== "constructor").map(shape));
const missing = x402UptoPermit2ProxyABI.map(shape).filter((s) => !compiled.has(s));
if (missing.length) {
  console.error("UptoPermit2Proxy.sol does not match @x402/evm's x402UptoPermit2ProxyABI; missing or different:");
  for (const m of missing) console.error(`  ${m}`);
  process.exit(1);
}

process.stdout.write(JSON.stringify({ token, uptoProxy }));
