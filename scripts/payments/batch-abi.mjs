// The batch-settlement escrow's ABI as @x402/evm calls it. The package does
// not export it (only its address and EIP-712 types), so it is read from the
// module its facilitator imports it from, whatever the bundler named that
// file: every call the package's client, server and facilitator make to the
// escrow is encoded with this array.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));

/** The package's batchSettlementABI. */
export async function packageBatchSettlementAbi() {
  const dir = join(here, "node_modules/@x402/evm/dist/esm/batch-settlement/facilitator");
  const source = readFileSync(join(dir, "index.mjs"), "utf8");
  const from = [...source.matchAll(/import\s*\{([^}]*)\}\s*from\s*"([^"]+)"/g)].find(([, names]) =>
    names.split(",").some((n) => n.trim() === "batchSettlementABI"),
  )?.[2];
  if (!from) throw new Error("@x402/evm's batch-settlement facilitator no longer imports batchSettlementABI");
  const { batchSettlementABI } = await import(pathToFileURL(join(dir, from)).href);
  return batchSettlementABI;
}

/** The pinned copy (batch-settlement-abi.json), which compile.mjs builds against. */
export const pinnedBatchSettlementAbi = () => JSON.parse(readFileSync(join(here, "batch-settlement-abi.json"), "utf8"));
