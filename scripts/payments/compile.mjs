// Compiles Token.sol offline with solc-js; imports resolve into node_modules.
// Prints {abi, bytecode} as JSON on stdout.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const solc = createRequire(import.meta.url)("solc");

const input = {
  language: "Solidity",
  sources: { "Token.sol": { content: readFileSync(join(here, "Token.sol"), "utf8") } },
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: "cancun",
    outputSelection: { "Token.sol": { Token: ["abi", "evm.bytecode.object"] } },
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
const token = out.contracts["Token.sol"].Token;
process.stdout.write(JSON.stringify({ abi: token.abi, bytecode: `0x${token.evm.bytecode.object}` }));
