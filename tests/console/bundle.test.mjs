// The console's vendored secp256k1 and keccak (shared/src/adapters/http/assets/
// noble-secp256k1.js) is what its header says it is: @noble/curves and
// @noble/hashes at the versions it names, bundled unchanged by esbuild from
// its three-line entry with its flags. Rebuilt here from the versions this
// package pins (package.json), it must come out byte for byte the same, so
// the page runs audited code and nothing else, and a version bump is a
// rebuild, not an edit.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { build } from "esbuild";

const ASSET = new URL("../../shared/src/adapters/http/assets/noble-secp256k1.js", import.meta.url);

test("the vendored noble bundle is the pinned packages, rebuilt as its header says", async () => {
  const vendored = await readFile(ASSET, "utf8");
  const end = vendored.indexOf("*/\n");
  const [header, body] = [vendored.slice(0, end), vendored.slice(end + 3)];
  for (const name of ["@noble/curves", "@noble/hashes", "esbuild"]) {
    const manifest = new URL(`node_modules/${name}/package.json`, import.meta.url);
    const { version } = JSON.parse(await readFile(manifest, "utf8"));
    assert.ok(header.includes(`${name} ${version}`), `the header names ${name} ${version}: ${header}`);
  }
  const entry = header.split("\n").filter((l) => /^ \*   (import|globalThis)/.test(l)).map((l) => l.slice(5));
  assert.equal(entry.length, 3, header);
  const flags = "esbuild entry.js --bundle --minify --format=iife --legal-comments=none";
  assert.ok(header.includes(flags), header);
  const built = await build({
    // The header's entry.js sat in a package of the default type, CommonJS,
    // which decides how esbuild wraps the modules; this package is ESM, so
    // the same entry is named as a CommonJS file.
    stdin: { contents: `${entry.join("\n")}\n`, resolveDir: import.meta.dirname, sourcefile: "entry.cjs" },
    bundle: true, minify: true, format: "iife", legalComments: "none", write: false, logLevel: "silent",
  });
  assert.equal(built.outputFiles[0].text, body, "rebuilt from the pinned packages, byte for byte");
});
