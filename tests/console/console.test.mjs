// The browser console end to end: headless Debian Chromium drives the real
// page served by a real `reeve serve`, with a real `reeve work` beside it,
// on the stack's Postgres, Redis, S3 and SQS, and pays on the local chain
// (anvil) through a real x402 facilitator. Run by scripts/console-test.sh,
// which gives this process a database and a queue of its own.
//
// A person creates a Space, picks a file, watches the digest run to the end
// and reads the SHA-256; a priced task shows its payment requirements and is
// paid with the browser's wallet, and the receipt names the chain's
// transaction; every refusal is shown in words; a metered task (x402 upto)
// is authorized up to its ceiling with Permit2 and the token's permit, then
// charged exactly what it used; the task list cancels a queued task, or the
// ticked ones at once (Cancel selected), and the credit a canceled paid task
// leaves pays the next one. An agent on the official TypeScript MCP SDK,
// with no wallet but URL elicitation declared, is given a pay link for a
// priced tool; the page pays it, and the agent's retried call gets that task. A service kind
// (examples/wordfreq under `cargo lambda watch`) shows its progress in its
// own words and ends with its output file's download link.
// A separate relay serves the page calling the API it was configured with,
// whatever API a link names. With REEVE_CONSOLE_SCREENSHOTS=1 it saves those
// states as docs/console-*.png.
//
// The wallet (test-wallet.js) is an EIP-1193 provider announced through
// EIP-6963; its answers come from this process, and its signatures from
// eth-account (signer.py) with anvil's account 2, which no other test pays
// from: its balance moves only by what this test pays.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, openSync, readFileSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const HERE = join(ROOT, "tests/console");
const REEVE = process.env.REEVE_BIN || join(process.env.CARGO_TARGET_DIR || join(ROOT, "target"), "debug/reeve");
const CHROMIUM = process.env.REEVE_CHROMIUM || "/usr/bin/chromium";
const PYTHON = process.env.REEVE_PAYER_PYTHON || join(ROOT, ".venv/bin/python");
const RPC = process.env.REEVE_CHAIN_RPC_URL || "http://127.0.0.1:8545";
const SHOTS = process.env.REEVE_CONSOLE_SCREENSHOTS === "1";
const LOGS = join(ROOT, ".stack");
// Flags for a quiet, hermetic browser: no network of its own, no updates.
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];

// tests/console/catalog.toml: its local price, and where it is paid to.
const LOCAL = "eip155:84532";
const TOKEN = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
const PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C";
const PRICE = 10000n;
// The facilitator of this test settles from anvil's account 2 too: no other
// process sends from it, so its transaction nonces are this test's alone.
const FACILITATOR_ACCOUNT = "2";
// keccak256("Transfer(address,address,uint256)")
const TRANSFER = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef";
// catalog.toml's fetch-metered: 0.001 USDC per MiB, at most 0.10; and what
// x402's upto scheme signs for.
const METERED = { rate: 1000n, ceiling: 100000n, unit: 1024n * 1024n };
const PERMIT2 = "0x000000000022D473030F116dDEE9F6B43aC78BA3";
const UPTO_PROXY = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002";

let serve, worker, relay, facilitator, facilitatorPort, signer, base, relayBase, context, page, profile, payer, site;
let lambdaWatch;
const pageErrors = [];

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer().listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => ok(port)); });
    s.on("error", fail);
  });
}
function run(name, command, args, env) {
  const log = openSync(join(LOGS, `console-${name}.log`), "a");
  return spawn(command, args, { cwd: ROOT, stdio: ["ignore", log, log], env });
}
function stop(child) {
  if (!child || child.exitCode !== null) return Promise.resolve();
  return new Promise((ok) => { child.once("exit", ok); child.kill("SIGTERM"); });
}
async function until(what, url, child, within = 60_000) {
  const end = Date.now() + within;
  for (;;) {
    try { if ((await fetch(url)).ok) return; } catch (_) { /* not up yet */ }
    if (Date.now() > end || child.exitCode !== null) throw new Error(`${what} is not up; see ${LOGS}/console-*.log`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
async function shot(name) {
  if (SHOTS) await page.screenshot({ path: join(ROOT, "docs", `console-${name}.png`), fullPage: true });
}
const value = (selector) => page.locator(selector).getAttribute("value");
const text = (selector) => page.locator(selector).textContent();

// ---------------------------------------------------------------- the chain
async function rpc(method, params) {
  const answer = await (await fetch(RPC, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }) })).json();
  if (answer.error) throw new Error(`${method}: ${JSON.stringify(answer.error)}`);
  return answer.result;
}
const word = (address) => `0x${address.slice(2).toLowerCase().padStart(64, "0")}`;
async function balance(address) {
  return BigInt(await rpc("eth_call", [{ to: TOKEN, data: `0x70a08231${word(address).slice(2)}` }, "latest"]));
}
// How much of `owner`'s token Permit2 may move.
async function permit2Allowance(owner) {
  return BigInt(await rpc("eth_call", [{ to: TOKEN, data: `0xdd62ed3e${word(owner).slice(2)}${word(PERMIT2).slice(2)}` }, "latest"]));
}

// confirmationMs: how long a settle waits for its receipt before it answers
// settlement_pending (x402's default, 3 minutes, unless given).
async function startFacilitator(confirmationMs) {
  const child = run("facilitator", "node", [join(ROOT, "scripts/payments/facilitator.mjs"), RPC, "127.0.0.1",
    String(facilitatorPort), FACILITATOR_ACCOUNT, ...(confirmationMs ? [String(confirmationMs)] : [])], process.env);
  await until("the test's facilitator", `http://127.0.0.1:${facilitatorPort}/supported`, child, 30_000);
  return child;
}

// signer.py: holds the chain's shared lock while it runs, and signs.
function startSigner() {
  const child = spawn(PYTHON, [join(HERE, "signer.py")], { stdio: ["pipe", "pipe", "inherit"], env: process.env });
  const waiting = [];
  createInterface({ input: child.stdout }).on("line", (line) => waiting.shift()?.resolve(JSON.parse(line)));
  child.on("exit", (code) => { for (const w of waiting.splice(0)) w.reject(new Error(`signer.py exited with ${code}`)); });
  const next = () => new Promise((resolve, reject) => waiting.push({ resolve, reject }));
  const ready = next();
  return {
    child, ready,
    async ask(request) {
      const answer = next();
      child.stdin.write(`${JSON.stringify(request)}\n`);
      const a = await answer;
      if (a.error) throw new Error(`signer.py: ${a.error}`);
      return a;
    },
  };
}

// ---------------------------------------------------------------- the wallet
// What the person and their wallet do, one request at a time. It starts on
// Base and does not know Base Sepolia, so the page must ask it to add it.
const wallet = {
  reset() {
    Object.assign(this, { address: payer, key: "payer", signWith: null, chainId: 8453, chains: new Set([8453]),
      refuseSwitch: false, refuseSign: false, readsChain: true, hold: null });
  },
  calls: [],
  signed: [],
};
const reply = (result) => JSON.stringify({ result });
const refuse = (code, message) => JSON.stringify({ error: { code, message } });
async function walletRequest(json) {
  const { method, params } = JSON.parse(json);
  wallet.calls.push(method);
  switch (method) {
    case "eth_requestAccounts": case "eth_accounts": return reply([wallet.address]);
    case "eth_chainId": return reply(`0x${wallet.chainId.toString(16)}`);
    case "wallet_switchEthereumChain": {
      if (wallet.refuseSwitch) return refuse(4001, "User rejected the request.");
      const id = parseInt(params[0].chainId, 16);
      if (!wallet.chains.has(id)) return refuse(4902, `Unrecognized chain ID "${params[0].chainId}".`);
      wallet.chainId = id;
      return reply(null);
    }
    case "wallet_addEthereumChain": {
      const id = parseInt(params[0].chainId, 16);
      wallet.chains.add(id); wallet.chainId = id;
      return reply(null);
    }
    // A wallet reads the chain through its own node: here, the local chain.
    case "eth_call":
      if (!wallet.readsChain) return refuse(4200, "eth_call is not supported");
      return reply(await rpc("eth_call", params));
    case "eth_signTypedData_v4": {
      await wallet.hold;
      if (wallet.refuseSign) return refuse(4001, "User denied message signature.");
      assert.equal(params[0].toLowerCase(), wallet.address.toLowerCase(), "the page signs as the account it was given");
      const typed = JSON.parse(params[1]);
      wallet.signed.push(typed);
      const { signature } = await signer.ask({ op: "sign", key: wallet.signWith || wallet.key, typed });
      return reply(signature);
    }
    default: return refuse(4200, `${method} is not supported`);
  }
}
function deferred() { let release; const promise = new Promise((r) => { release = r; }); return { promise, release }; }

// ---------------------------------------------------------------- set-up
before(async () => {
  signer = startSigner();
  ({ payer } = await signer.ready);
  wallet.reset();
  facilitatorPort = await freePort();
  facilitator = await startFacilitator();

  const [port, relayPort, relayMetricsPort] = [await freePort(), await freePort(), await freePort()];
  base = `http://127.0.0.1:${port}`;
  relayBase = `http://127.0.0.1:${relayPort}`;
  const env = {
    ...process.env,
    REEVE_CATALOG: join(HERE, "catalog.toml"),
    REEVE_FACILITATOR_URL: `http://127.0.0.1:${facilitatorPort}`,
    // The relay of its own below serves the page from another origin.
    REEVE_CORS_ORIGINS: [process.env.REEVE_CORS_ORIGINS, relayBase].filter(Boolean).join(","),
  };
  // The worker is a process of its own, so the cancel test can stop it; an
  // all-in-one `reeve serve` is told to run none.
  const help = spawnSync(REEVE, ["serve", "--help"], { encoding: "utf8" }).stdout || "";
  const noWorker = help.includes("--no-worker") ? ["--no-worker"] : [];
  serve = run("serve", REEVE, ["serve", "--bind", `127.0.0.1:${port}`, ...noWorker], env);
  // wordfreq: the function under `cargo lambda watch`, in a process group
  // of its own (it runs `cargo run` and the function under it); its Invoke
  // client pointed there, and its reports sent to this `reeve serve`.
  const lambdaPort = await freePort();
  // The whole workspace, not `-p wordfreq`: selected alone, wordfreq's
  // dependencies resolve other features and would be rebuilt here.
  lambdaWatch = spawn("cargo", ["lambda", "watch", "-A", "127.0.0.1", "-P", String(lambdaPort),
    "--concurrency", "2", "--env-var", "WORDFREQ_REPORT_EVERY=4"],
  { cwd: ROOT, detached: true, stdio: ["ignore", openSync(join(LOGS, "console-wordfreq.log"), "a"), openSync(join(LOGS, "console-wordfreq.log"), "a")] });
  // The metered fetch downloads from the test's own server on loopback.
  worker = run("work", REEVE, ["work"], { ...env, REEVE_FETCH_ALLOW: "127.0.0.1", REEVE_OUTBOUND_ALLOW_HTTP: "1",
    AWS_ENDPOINT_URL_LAMBDA: `http://127.0.0.1:${lambdaPort}`, REEVE_REPORT_URL: `${base}/v1/executor/reports` });
  // A relay alone, as in AWS: its page calls the API it is configured with.
  relay = run("relay", REEVE, ["relay", "--bind", `127.0.0.1:${relayPort}`, "--metrics-bind", `127.0.0.1:${relayMetricsPort}`],
    { ...env, REEVE_API_ORIGIN: base });
  await until("reeve serve", `${base}/healthz`, serve);
  await until("reeve relay", `${relayBase}/healthz`, relay);

  profile = mkdtempSync(join(tmpdir(), "reeve-console-"));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, args: FLAGS, viewport: { width: 1100, height: 900 },
  });
  page = await withWallet(context.pages()[0] || await context.newPage());
});

// `tab` with the test wallet: the binding it answers through, then the
// provider itself, in every document before the page's own scripts.
async function withWallet(tab) {
  tab.on("pageerror", (e) => pageErrors.push(e));
  await tab.exposeFunction("reeveTestWallet", walletRequest);
  const cdp = await context.newCDPSession(tab);
  // A session's scripts run only once its Page domain is enabled.
  await cdp.send("Page.enable");
  await cdp.send("Page.addScriptToEvaluateOnNewDocument", { source: readFileSync(join(HERE, "test-wallet.js"), "utf8") });
  return tab;
}

after(async () => {
  assert.deepEqual(pageErrors, [], "the page threw no error");
  await context?.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
  await Promise.all([stop(worker), stop(serve), stop(relay), stop(facilitator)]);
  if (lambdaWatch && lambdaWatch.exitCode === null) {
    const exited = new Promise((ok) => lambdaWatch.once("exit", ok));
    try { process.kill(-lambdaWatch.pid, "SIGTERM"); } catch (_) { /* already gone */ }
    await exited;
  }
  site?.close();
  signer?.child.stdin.end();
  await stop(signer?.child);
});

// ---------------------------------------------------------------- helpers
async function choose(kind) {
  await page.click(`#catalog tr[data-kind=${kind}] button`);
  await page.waitForSelector("#in-upload_id-file");
}
async function upload(name, bytes, mimeType = "application/octet-stream") {
  await page.setInputFiles("#in-upload_id-file", { name, mimeType, buffer: bytes });
  await page.waitForSelector("#in-upload_id-status[data-uploaded]");
  return page.locator("#in-upload_id-status").getAttribute("data-uploaded");
}
// A priced task up to its payment table.
async function priced(name, kind = "paid-digest", shown = "button.pay") {
  await choose(kind);
  const bytes = randomBytes(4096);
  const uploadId = await upload(name, bytes);
  await page.click("#task-create");
  await page.waitForSelector(`#payment:not([hidden]) #payment-table ${shown}`);
  return { bytes, uploadId };
}
const payLocal = () => page.click(`#payment-table button.pay[data-network="${LOCAL}"]`);
// The Space, as the page's session reads it.
async function space() {
  return page.evaluate(async () => (await (await fetch("/v1/space", { headers: { authorization: `Bearer ${state.token}` } })).json()));
}
async function tasks() {
  return page.evaluate(async () => (await (await fetch("/v1/tasks?limit=100", { headers: { authorization: `Bearer ${state.token}` } })).json()).tasks);
}

// ---------------------------------------------------------------- tests
test("the relay's page calls the API it was configured with, not one a link names", async () => {
  // Another server, as an attacker's would be: it must hear nothing.
  const heard = [];
  const attacker = createHttpServer((req, res) => { heard.push(`${req.method} ${req.url}`); res.end(); });
  await new Promise((ok) => attacker.listen(0, "127.0.0.1", ok));
  const other = await context.newPage();
  other.on("pageerror", (e) => pageErrors.push(e));
  const calls = [];
  other.on("request", (r) => { if (new URL(r.url()).pathname.startsWith("/v1/")) calls.push(new URL(r.url()).origin); });
  try {
    const reached = new Promise((ok) => attacker.once("request", ok));
    await other.goto(`${relayBase}/#api=http://127.0.0.1:${attacker.address().port}`);
    await Promise.race([other.waitForSelector("body[data-catalog=loaded]"), reached]);
    assert.deepEqual(heard, [], "the page asked the server its link named nothing, not even the catalog");
    // A Space created, closed, and opened again by typing its ID.
    await other.click("#space-create");
    await other.waitForSelector("body[data-space=open]");
    const spaceId = await other.locator("#space-id-shown").textContent();
    await other.click("#space-close");
    await other.fill("#space-id", spaceId);
    await other.click("#space-open button[type=submit]");
    await other.waitForSelector("body[data-space=open]");
    assert.deepEqual(heard, [], "the server the link named received nothing");
    assert.ok(calls.length >= 4, calls.join(" "));
    assert.deepEqual([...new Set(calls)], [base], "every API call went to the relay's configured API");
  } finally {
    await other.close();
    attacker.close();
  }
});

test("a digest task from the file picker to its SHA-256", async () => {
  // Every URL the page asks for: the stream opens with a ticket, and no URL
  // ever carries a session token (issue 39).
  const urls = [];
  const record = (request) => urls.push(request.url());
  page.on("request", record);
  await page.goto(`${base}/`);
  await page.waitForSelector("body[data-catalog=loaded]");
  const kinds = await page.locator("#catalog tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.kind));
  assert.deepEqual(kinds.sort(), ["digest", "fetch-metered", "paid-digest", "paid-digest-channel", "wordfreq"]);
  assert.equal(await page.locator("#catalog tr[data-kind=digest] td").nth(2).textContent(), "free");
  assert.equal(await page.locator("#catalog tr[data-kind=paid-digest] td").nth(2).textContent(),
    "0.01 USDC on Base Sepolia (test) (eip155:84532)");
  assert.equal(await page.locator("#catalog tr[data-kind=fetch-metered] td").nth(2).textContent(),
    "up to 0.1 USDC on Base Sepolia (test) (eip155:84532), charged 0.001 USDC per MiB used");
  assert.equal(await page.locator("#catalog tr[data-kind=paid-digest-channel] td").nth(2).textContent(),
    "0.01 USDC on Base Sepolia (test) (eip155:84532) a task, from a batch-settlement channel");
  // Base is named too, though the local facilitator cannot settle it.
  assert.equal(await page.evaluate(() => networkText("eip155:8453")), "Base (eip155:8453)");
  await shot("1-catalog");

  await page.click("#space-create");
  await page.waitForSelector("body[data-space=open]");
  const spaceId = await page.locator("#space-id-shown").textContent();
  assert.match(spaceId, /^[0-9]{20}$/);
  // The Space ID stays in the page's memory: not in the URL, not in storage.
  assert.ok(!page.url().includes(spaceId));
  const stored = await page.evaluate(() => JSON.stringify({ ...localStorage }) + JSON.stringify({ ...sessionStorage }) + document.cookie);
  assert.ok(!stored.includes(spaceId), stored);

  await choose("digest");
  const bytes = randomBytes(3 * 1024 * 1024 + 12345);
  const sha256 = createHash("sha256").update(bytes).digest("hex");
  const uploadId = await upload("photo.bin", bytes);
  assert.equal(await value("#in-upload_id-bar"), "1");
  assert.match(uploadId, /^[0-9A-HJKMNP-TV-Z]{26}$/);
  await shot("2-uploaded");

  await page.click("#task-create");
  await page.waitForSelector("body[data-finished]", { timeout: 30_000 });
  assert.equal(await page.locator("body").getAttribute("data-finished"), "completed");
  assert.equal(await text("#status"), "completed");
  assert.equal(await value("#bar"), "1");
  assert.equal(await text("#percent"), "100%");
  const result = JSON.parse(await text("#result-json"));
  assert.equal(result.sha256, sha256);
  assert.equal(result.size, bytes.length);
  const log = await text("#log");
  for (const wanted of ["status queued", "status running (attempt 1)", "progress 100% (3.0 MiB of 3.0 MiB)", "result ready", "status completed"]) {
    assert.ok(log.includes(wanted), `the log shows "${wanted}":\n${log}`);
  }
  assert.equal(await page.locator("#receipt").isHidden(), true, "a free task has no receipt");
  await shot("3-completed");
  page.off("request", record);
  assert.ok(urls.some((u) => /\/v1\/tasks\/[0-9A-Z]{26}\/ticket$/.test(u)), urls.join("\n"));
  assert.ok(urls.some((u) => /\/events\?ticket=/.test(u)), urls.join("\n"));
  const token = await page.evaluate(() => state.token);
  assert.ok(token);
  for (const u of urls) {
    assert.ok(!u.includes("access_token") && !u.includes(token), `a session token in a URL: ${u}`);
  }
});

// The link the share test made, for the rotation test to end.
let shared;

test("Share makes a link that watches the one task read-only, renewing its ticket with the share token; no session token in it", async () => {
  // The page watches the digest task the test before completed.
  const task = await page.evaluate(() => document.body.dataset.watching);
  assert.match(task, /^[0-9A-HJKMNP-TV-Z]{26}$/);
  const token = await page.evaluate(() => state.token);
  const spaceId = await page.evaluate(() => state.spaceId);
  assert.equal(await page.locator("#share-task").isHidden(), false, "the owner may share");
  await page.click("#share-task");
  await page.waitForSelector("#share:not([hidden])");
  const link = await page.locator("#share-link").inputValue();
  const url = new URL(link);
  assert.equal(url.origin, new URL(page.url()).origin, "a link to this console");
  const fragment = new URLSearchParams(url.hash.slice(1));
  assert.equal(fragment.get("task"), task);
  const share = fragment.get("share");
  assert.ok(share && url.search === "", `the share token is in the fragment, never the query: ${link}`);
  assert.ok(!link.includes(token) && !link.includes(spaceId), `the link carries neither the session token nor the Space ID: ${link}`);
  assert.match(await text("#share"), /24 hours/);
  shared = { task, share };

  // Someone else opens it: a page of its own, no Space, no session.
  const other = await context.newPage();
  other.on("pageerror", (e) => pageErrors.push(e));
  const asked = [];
  other.on("request", (r) => {
    if (new URL(r.url()).pathname.startsWith("/v1/")) asked.push({ url: r.url(), method: r.method(), authorization: r.headers().authorization || "" });
  });
  try {
    await other.goto(link);
    await other.waitForSelector("body[data-finished]", { timeout: 30_000 });
    assert.equal(await other.locator("body").getAttribute("data-finished"), "completed");
    assert.equal(await other.locator("#status").textContent(), "completed");
    assert.match(await other.locator("#log").textContent(), /result ready/);
    assert.equal(JSON.parse(await other.locator("#result-json").textContent()).size, 3 * 1024 * 1024 + 12345);
    // It asked for a ticket with the share token, in the header, and opened
    // the stream with that ticket; no URL held the share or a session.
    const tickets = asked.filter((r) => r.method === "POST" && r.url.endsWith(`/v1/tasks/${task}/ticket`));
    assert.equal(tickets.length, 1, JSON.stringify(asked));
    assert.equal(tickets[0].authorization, `Share ${share}`);
    assert.ok(asked.some((r) => /\/events\?ticket=/.test(r.url)), JSON.stringify(asked));
    for (const r of asked) assert.ok(!r.url.includes(share) && !r.url.includes(token), `a credential in a URL: ${r.url}`);
    assert.ok(!asked.some((r) => r.authorization.startsWith("Bearer")), "the shared page holds no session");
    // It may watch, no more: no Share button, no Space, and the share token
    // opens nothing where a session is needed.
    assert.equal(await other.locator("#share-task").isHidden(), true);
    assert.equal(await other.evaluate(() => state.token), null);
    const asSession = await other.evaluate(async (s) => (await fetch("/v1/space", { headers: { authorization: `Bearer ${s}` } })).status, share);
    assert.equal(asSession, 401);

    // A new stream asks for a new ticket with the share: watched again, the
    // page trades the same share token for a fresh ticket.
    await other.evaluate(([t, s]) => watch(t, null, null, { share: s }), [task, share]);
    await other.waitForSelector("body[data-finished=completed]");
    assert.equal(asked.filter((r) => r.method === "POST" && r.url.endsWith("/ticket")).length, 2);

    // A link for another task shows the refusal in words.
    await other.goto("about:blank");
    await other.goto(`${url.origin}/#task=${task.slice(0, -1)}${task.endsWith("0") ? "1" : "0"}&share=${share}`);
    await other.waitForFunction(() => /invalid_share/.test(document.getElementById("status").textContent));
  } finally {
    await other.close();
  }
});

test("a service kind shows its progress in its own words, then its output file with a download link", async () => {
  await choose("wordfreq");
  const lines = Array.from({ length: 12 }, (_, n) => `The cat sat on the mat, line ${n}; the end.`).join("\n") + "\n";
  await upload("words.txt", Buffer.from(lines), "text/plain");
  // The page still shows the task the test before watched (finished):
  // wait for this one's end, not that one's.
  const before = await page.evaluate(() => document.body.dataset.watching);
  await page.click("#task-create");
  // The first run compiles the function under cargo lambda watch.
  await page.waitForFunction(
    (prev) => document.body.dataset.watching && document.body.dataset.watching !== prev && document.body.dataset.finished,
    before,
    { timeout: 240_000 },
  );
  assert.equal(await page.locator("body").getAttribute("data-finished"), "completed", await text("#log"));
  assert.equal(await value("#bar"), "1");
  assert.equal(await text("#percent"), "100%");
  assert.match(await text("#progress-message"), /^12 lines read/);
  const log = await text("#log");
  for (const wanted of [/progress \d+% — 4 lines read/, /progress 100% — 12 lines read; writing top-100\.csv/, /result ready/]) {
    assert.match(log, wanted);
  }
  const summary = JSON.parse(await text("#result-json"));
  assert.equal(summary.lines, 12);
  const link = page.locator("#outputs a.output-link");
  await link.waitFor();
  assert.equal(await link.count(), 1);
  assert.equal(await link.textContent(), "top-100.csv");
  assert.match(await text("#outputs li"), /^top-100\.csv \(\d+ B, text\/csv\) — link valid until /);
  const csv = await (await fetch(await link.getAttribute("href"))).text();
  assert.ok(csv.startsWith("word,count\nthe,36\n"), csv);
});

test("a batch-settlement price says which client pays it, with no Pay button the wallet could not honour", async () => {
  await priced("channel.bin", "paid-digest-channel", `.channel-note`);
  const rows = await page.locator("#payment-table tbody tr").allTextContents();
  assert.equal(rows.length, 1, rows.join("\n"));
  const channel = page.locator(`#payment-table tbody tr[data-scheme="batch-settlement"]`);
  assert.match(await channel.textContent(), /0\.01 USDC a task \(10000 atomic\).*with a batch-settlement client$/);
  assert.match(await channel.locator(".channel-note").getAttribute("title"), /reeve task create --pay --channel/);
  assert.equal(await page.locator("#payment-table button.pay").count(), 0);
  assert.deepEqual(wallet.calls, [], "no wallet is asked anything");
});

test("a priced task shows its payment requirements, each with a Pay button for the wallet", async () => {
  await priced("report.bin");
  const rows = await page.locator("#payment-table tbody tr").allTextContents();
  assert.equal(rows.length, 1, rows.join("\n"));
  assert.match(rows[0], /^Base Sepolia \(test\) eip155:84532\s*0\.01 USDC \(10000 atomic\)0x036CbD53…8f3dCF7e0x209693Bc6afc0C5328bA36FaF03C514EF312287CPay$/);
  assert.equal(await page.locator("#payment-table button.pay").count(), 1);
  assert.match(await text("#wallet-note"), /with Reeve test wallet/);
  const challenge = JSON.parse(await text("#payment-json"));
  assert.equal(challenge.x402Version, 2);
  assert.deepEqual(wallet.calls, [], "no wallet is asked anything before Pay");
  await shot("4-payment");
});

let paidSignature;
test("Pay: the wallet signs, the task completes, the payer pays exactly the price and the receipt shows the chain's transaction", async () => {
  const sent = [];
  const watch = (r) => { const h = r.headers()["payment-signature"]; if (h) sent.push(h); };
  page.on("request", watch);
  const before = await balance(payer);
  const hold = deferred();
  wallet.hold = hold.promise;
  await payLocal();
  await page.waitForSelector("#pay-status[data-stage=signing]");
  // Account, chain (Base Sepolia was unknown to the wallet, so added),
  // balance, signature.
  assert.deepEqual(wallet.calls, ["eth_requestAccounts", "eth_chainId", "wallet_switchEthereumChain",
    "wallet_addEthereumChain", "eth_chainId", "eth_call", "eth_signTypedData_v4"]);
  assert.equal(wallet.chainId, 84532);
  assert.match(await text("#pay-status"), /^Confirm in Reeve test wallet: pay 0\.01 USDC on Base Sepolia \(test\) \(eip155:84532\) from 0x/);
  await shot("6-wallet-prompt");
  hold.release();

  await page.waitForSelector("#receipt[data-paid=payment]", { timeout: 30_000 });
  await page.waitForSelector("body[data-finished]", { timeout: 30_000 });
  page.off("request", watch);
  assert.equal(await page.locator("body").getAttribute("data-finished"), "completed");
  assert.ok((await text("#result-json")).includes("sha256"));

  // What was signed: EIP-3009 from the requirement.
  const [typed] = wallet.signed;
  assert.equal(typed.primaryType, "TransferWithAuthorization");
  assert.deepEqual(typed.domain, { name: "USDC", version: "2", chainId: 84532, verifyingContract: TOKEN });
  assert.equal(typed.message.to, PAY_TO);
  assert.equal(typed.message.value, String(PRICE));
  const lifetime = Number(typed.message.validBefore) - Date.now() / 1000;
  assert.ok(lifetime > 270 && lifetime <= 300, `validBefore is within maxTimeoutSeconds (300): ${lifetime}`);
  assert.match(typed.message.nonce, /^0x[0-9a-f]{64}$/);

  // The receipt, and the chain's own record of it.
  assert.equal(await text("#receipt-payer"), payer.toLowerCase());
  assert.equal(await text("#receipt-network"), "Base Sepolia (test) (eip155:84532)");
  const tx = await text("#receipt-transaction");
  const receipt = await rpc("eth_getTransactionReceipt", [tx]);
  assert.equal(receipt.status, "0x1", JSON.stringify(receipt));
  const transfer = receipt.logs.find((l) => l.address.toLowerCase() === TOKEN.toLowerCase() && l.topics[0] === TRANSFER);
  assert.deepEqual([transfer.topics[1], transfer.topics[2], BigInt(transfer.data)], [word(payer), word(PAY_TO), PRICE]);
  assert.equal(await balance(payer), before - PRICE, "the payer's balance fell by exactly the price");

  // The Space's payments list it.
  await page.waitForSelector(`#payments tr[data-transaction="${tx}"]`);
  assert.equal(sent.length, 1);
  paidSignature = sent[0];

  // "verify" checks the signed receipt in the page: signed by the address
  // the catalog publishes, and, the task having ended, what it delivered.
  await page.click("#receipt-verify");
  await page.waitForSelector("#receipt-verified[data-verified=true]");
  const published = (await (await fetch(`${base}/v1/catalog`)).json()).receipts.signer;
  assert.equal(await text("#receipt-signer"), published);
  assert.match(await text("#receipt-verified"), /^Verified: signed by this service's published key/);
  assert.match(await text("#receipt-result-sha256"), /^[0-9a-f]{64}$/);
  assert.match(await page.locator("#receipt-download").getAttribute("download"), /^receipt-[0-9A-Z]{26}\.json$/);
  await shot("7-receipt");
  // The same receipt with one byte of its payload changed (the amount, one
  // more) is shown as not verified.
  const forge = async (route) => {
    const response = await route.fetch();
    const receipt = await response.json();
    const [header, payload, signature] = receipt.signature.split(".");
    const changed = JSON.parse(Buffer.from(payload, "base64url"));
    changed.amount = String(BigInt(changed.amount) + 1n);
    receipt.signature = [header, Buffer.from(JSON.stringify(changed)).toString("base64url"), signature].join(".");
    await route.fulfill({ response, json: receipt });
  };
  await page.route("**/v1/tasks/*/receipt", forge);
  await page.click("#receipt-verify");
  await page.waitForSelector("#receipt-verified[data-verified=false]");
  assert.match(await text("#receipt-verified"), /^Not verified: the signature does not match what it signs/);
  assert.equal(await page.locator("#receipt-signer").count(), 0);
  await page.unroute("**/v1/tasks/*/receipt", forge);
});

test("every refusal is shown in words with the server's code, and the form stays as it was", async () => {
  const { uploadId } = await priced("refusals.bin");
  const mismatch = (header) => {
    const p = JSON.parse(Buffer.from(header, "base64"));
    p.accepted.amount = "1";
    return Buffer.from(JSON.stringify(p)).toString("base64");
  };
  const unfunded = async () => {
    const fresh = await signer.ask({ op: "account" });
    Object.assign(wallet, { chainId: 84532, address: fresh.address, key: fresh.key });
  };
  const cases = [
    { name: "the wallet stays on another chain", code: "wrong_chain",
      words: /not on Base Sepolia \(test\) \(eip155:84532\), and did not switch/,
      setup: () => { wallet.refuseSwitch = true; } },
    { name: "the person refuses to sign", code: "signature_refused", words: /refused in the wallet/,
      setup: () => { wallet.chainId = 84532; wallet.refuseSign = true; } },
    { name: "a signature not made by the paying account", code: "payment_invalid", words: /refused the signature/,
      message: /the payment was refused: .*signature/,
      setup: async () => { wallet.chainId = 84532; wallet.signWith = (await signer.ask({ op: "account" })).key; } },
    { name: "an unfunded payer: the page reads its balance and asks no signature", code: "insufficient_balance",
      words: /^The paying account does not hold 0\.01 USDC on Base Sepolia \(test\) \(eip155:84532\)\. Nothing was signed/,
      message: /0x[0-9a-fA-F]{40} holds 0 USDC on Base Sepolia \(test\) \(eip155:84532\), and this payment is 0\.01 USDC/,
      signs: false, setup: unfunded },
    { name: "an unfunded payer whose wallet cannot read balances: the facilitator refuses", code: "payment_invalid",
      // The local chain has no Multicall3, with which the facilitator tells
      // a low balance from other failures: it says simulation_failed there.
      words: /^The payment service could not run the transfer on the chain; most often the paying account 0x[0-9a-fA-F]{40} does not hold 0\.01 USDC on Base Sepolia|^The paying account 0x[0-9a-fA-F]{40} does not hold 0\.01 USDC/,
      message: /the payment was refused: invalid_exact_evm_(transaction_simulation_failed|insufficient_balance)/,
      setup: async () => { await unfunded(); wallet.readsChain = false; } },
    { name: "a payment for another price", code: "payment_mismatch", words: /does not match any price/,
      setup: () => { wallet.chainId = 84532; }, rewrite: mismatch },
    { name: "a signature used before, replayed", code: "payment_replayed", words: /already used: one signature pays for one task/,
      setup: () => { wallet.chainId = 84532; }, rewrite: () => paidSignature },
  ];
  const before = { balance: await balance(payer), payments: (await space()).payments.length, tasks: (await tasks()).length };
  for (const c of cases) {
    wallet.reset();
    await c.setup();
    if (c.rewrite) {
      await page.route(`${base}/v1/tasks/paid-digest`, (route) => {
        const headers = route.request().headers();
        route.continue({ headers: { ...headers, "payment-signature": c.rewrite(headers["payment-signature"]) } });
      }, { times: 1 });
    }
    const signed = wallet.signed.length;
    await payLocal();
    await page.waitForSelector(`#pay-status[data-code=${c.code}]`, { timeout: 20_000 });
    if (c.signs === false) assert.equal(wallet.signed.length, signed, `${c.name}: nothing was signed`);
    const shown = await text("#pay-status");
    assert.match(shown, c.words, `${c.name}: ${shown}`);
    assert.ok(shown.includes(c.code), `${c.name}: the code is shown: ${shown}`);
    if (c.message) assert.match(shown, c.message, `${c.name}: the server's message is shown`);
    // The form as it was: the same upload, the same table, Pay again possible.
    assert.equal(await page.locator("#in-upload_id").inputValue(), uploadId, c.name);
    assert.equal(await page.locator("#payment-table button.pay:enabled").count(), 1, c.name);
    assert.equal(await page.locator("#receipt").isHidden(), true, c.name);
  }
  assert.equal(await balance(payer), before.balance, "nothing was charged");
  assert.equal((await space()).payments.length, before.payments);
  assert.equal((await tasks()).length, before.tasks, "no task was created");
  wallet.reset();
});

test("with the facilitator stopped, Pay shows facilitator_unavailable and charges nothing; the same signature pays once it is back", async () => {
  wallet.reset(); wallet.chainId = 84532;
  const before = { balance: await balance(payer), payments: (await space()).payments.length, tasks: (await tasks()).length };
  await stop(facilitator);
  try {
    await payLocal();
    await page.waitForSelector("#pay-status[data-code=facilitator_unavailable]", { timeout: 30_000 });
    assert.match(await text("#pay-status"), /could not be reached.*facilitator_unavailable: the payment facilitator is unavailable/s);
    assert.equal(await balance(payer), before.balance, "nothing was charged");
    assert.equal((await space()).payments.length, before.payments);
    assert.equal((await tasks()).length, before.tasks);
  } finally {
    facilitator = await startFacilitator();
  }
  const signatures = wallet.signed.length;
  await page.click("#pay-retry");
  await page.waitForSelector("#receipt[data-paid=payment]", { timeout: 30_000 });
  assert.equal(wallet.signed.length, signatures, "the same signature, not a new one");
  assert.equal(await balance(payer), before.balance - PRICE, "paid once");
  await page.waitForSelector("body[data-finished=completed]", { timeout: 30_000 });
});

test("a settlement still pending is said so (payment_pending), and the page resends the same signature until it has its one task", async () => {
  // A facilitator that waits a second for the receipt, then answers
  // settlement_pending with the transaction it broadcast, on a chain that
  // mines nothing meanwhile (held exclusive, so no other test is stalled
  // midway: they wait for it).
  await stop(facilitator);
  facilitator = await startFacilitator(1000);
  let paused = false;
  try {
    wallet.reset(); wallet.chainId = 84532;
    const before = await balance(payer);
    await priced("pending.bin");
    const signatures = wallet.signed.length, earlier = (await space()).payments, payments = earlier.length;
    await signer.ask({ op: "pause" });
    paused = true;
    await payLocal();
    await page.waitForSelector("#pay-status[data-code=payment_pending][data-resending=true]", { timeout: 30_000 });
    assert.match(await text("#pay-status"),
      /^The payment was sent to be settled and whether it went through is not known yet: it may still be charged\. Do not pay again.* payment_pending: .*Retry-After.* The page sends it again by itself in \d+ s\.$/);
    assert.equal((await space()).payments.length, payments, "no payment recorded while its outcome is unknown");
    await signer.ask({ op: "resume" });
    paused = false;
    // The resend that finds the transfer on chain gets the task it bought
    // (answered as a replay: the settlement's own answer was the one lost),
    // and the page follows that task to its end.
    const seen = new Set(earlier.map((p) => p.task_id));
    let paid;
    for (const deadline = Date.now() + 60_000; !paid && Date.now() < deadline;) {
      paid = (await space()).payments.find((p) => !seen.has(p.task_id));
      if (!paid) await new Promise((r) => setTimeout(r, 500));
    }
    assert.ok(paid, "the resent payment bought its task");
    await page.waitForSelector(`body[data-watching="${paid.task_id}"][data-finished=completed]`, { timeout: 30_000 });
    assert.equal(wallet.signed.length, signatures + 1, "one signature, sent again as it was");
    assert.equal(await balance(payer), before - PRICE, "charged once");
    assert.equal((await space()).payments.length, payments + 1, "one payment recorded, for its one task");
  } finally {
    if (paused) await signer.ask({ op: "resume" });
    await stop(facilitator);
    facilitator = await startFacilitator();
  }
});

// ---------------------------------------------------------------- metered
// A file of `size` bytes at `${url}`, served on loopback for the metered
// fetch: what it downloads, and so what it is charged, is known.
async function serveFile(size) {
  const body = randomBytes(size);
  // One at a time: a server left listening keeps the test process alive.
  site?.close();
  site = createHttpServer((req, res) => {
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(body.length) });
    res.end(req.method === "HEAD" ? undefined : body);
  });
  await new Promise((ok) => site.listen(0, "127.0.0.1", ok));
  return { body, url: `http://127.0.0.1:${site.address().port}/file` };
}
// The metered fetch of `url` up to its payment table.
async function metered(url) {
  await page.click("#catalog tr[data-kind=fetch-metered] button");
  await page.waitForSelector("#in-url");
  await page.fill("#in-url", url);
  await page.click("#task-create");
  await page.waitForSelector(`#payment:not([hidden]) #payment-table button.pay[data-scheme=upto]`);
}
// The receipt's states (data-metered), in order, however fast they follow
// each other: a failure may end the task before a poll sees it authorized.
async function recordReceipt() {
  await page.evaluate(() => {
    window.receiptStates?.observer.disconnect();
    const receipt = document.getElementById("receipt"), old = [];
    const observer = new MutationObserver((records) => { for (const r of records) old.push(r.oldValue); });
    observer.observe(receipt, { attributes: true, attributeFilter: ["data-metered"], attributeOldValue: true });
    window.receiptStates = { observer, seen: () => [...old.slice(1), receipt.dataset.metered] };
  });
}
const receiptStates = () => page.evaluate(() => window.receiptStates.seen());
// A payer of its own for the metered tests: a fresh key holding test USDC
// and no gas, which never approved Permit2, so it pays through the token's
// permit (eip2612GasSponsoring) and nothing of anvil's account 2's standing
// (which other runs may have approved) decides the path taken.
let meteredPayer;
const METERED_FUNDS = 1_000_000n;
async function freshMeteredPayer() {
  if (!meteredPayer) {
    meteredPayer = await signer.ask({ op: "account" });
    await signer.ask({ op: "fund", address: meteredPayer.address, amount: String(METERED_FUNDS) });
  }
  wallet.reset();
  Object.assign(wallet, { chainId: 84532, address: meteredPayer.address, key: meteredPayer.key });
  return meteredPayer.address;
}

test("a metered price with no gas sponsoring offered: a payer that never approved Permit2 is told to approve it, and nothing is signed", async () => {
  const from = await freshMeteredPayer();
  assert.equal(await permit2Allowance(from), 0n);
  // The same 402 without its eip2612GasSponsoring extension, as a server
  // that offers none would send it.
  await page.route(`${base}/v1/tasks/fetch-metered`, async (route) => {
    const res = await route.fetch();
    const strip = (doc) => { delete doc.extensions?.eip2612GasSponsoring; return doc; };
    const header = strip(JSON.parse(Buffer.from(res.headers()["payment-required"], "base64")));
    const headers = { ...res.headers(), "payment-required": Buffer.from(JSON.stringify(header)).toString("base64") };
    delete headers["content-length"];
    await route.fulfill({ status: res.status(), headers, body: JSON.stringify(strip(await res.json())) });
  }, { times: 1 });
  await metered("http://127.0.0.1:9/never-fetched");
  const signed = wallet.signed.length, tasksBefore = (await tasks()).length;
  await page.click(`#payment-table button.pay[data-scheme=upto]`);
  await page.waitForSelector("#pay-status[data-code=permit2_approval_required]", { timeout: 20_000 });
  assert.match(await text("#pay-status"),
    new RegExp(`^The paying account has not let Permit2 \\(${PERMIT2}\\) move its USDC, which a metered payment needs\\. Send approve\\(${PERMIT2}, max\\) on the token ${TOKEN} once .*Nothing was signed or charged\\. permit2_approval_required: ${from} lets Permit2 .* move 0 USDC, below the ceiling of 0\\.1 USDC, and this server offers no signed permit instead$`));
  assert.equal(wallet.signed.length, signed, "no signature was asked for");
  assert.equal((await tasks()).length, tasksBefore, "no task was created");
  assert.equal(await balance(from), METERED_FUNDS);
});

test("a wallet that cannot read the chain signs Permit2's authorization alone; the server's permit2_approval_required is said in words", async () => {
  const from = await freshMeteredPayer();
  wallet.readsChain = false;
  await metered("http://127.0.0.1:9/never-fetched");
  const signed = wallet.signed.length, tasksBefore = (await tasks()).length;
  await page.click(`#payment-table button.pay[data-scheme=upto]`);
  await page.waitForSelector("#pay-status[data-code=permit2_approval_required]", { timeout: 20_000 });
  assert.deepEqual(wallet.signed.slice(signed).map((t) => t.primaryType), ["PermitWitnessTransferFrom"], "no permit without its nonce");
  const shown = await text("#pay-status");
  assert.match(shown, new RegExp(`^The paying account ${from} has not let Permit2 \\(${PERMIT2}\\) move its USDC, which a metered payment needs\\. .* permit2_approval_required: .*approve\\(Permit2, max\\)`), shown);
  assert.equal(await page.locator("#payment-table button.pay:enabled").count(), 1, "Pay again possible");
  assert.equal((await tasks()).length, tasksBefore, "no task was created");
  assert.equal(await balance(from), METERED_FUNDS);
  wallet.reset();
});

test("a metered task: the wallet authorizes up to the ceiling (Permit2 and the token's permit, no gas), the page shows it authorized, then charged exactly what the fetch used", async () => {
  const from = await freshMeteredPayer();
  // 1.5 MiB and a byte: 1500.001 units' worth of 1000 atomic per MiB,
  // rounded up to 1501 atomic units (0.001501 USDC).
  const { body, url } = await serveFile(1.5 * 1024 * 1024 + 1);
  const charge = (BigInt(body.length) * METERED.rate + METERED.unit - 1n) / METERED.unit;
  assert.equal(charge, 1501n);
  const sent = [];
  const watchHeaders = (r) => { const h = r.headers()["payment-signature"]; if (h) sent.push(JSON.parse(Buffer.from(h, "base64"))); };
  page.on("request", watchHeaders);

  await metered(url);
  const rows = await page.locator("#payment-table tbody tr").allTextContents();
  assert.equal(rows.length, 1, rows.join("\n"));
  assert.match(rows[0], /^Base Sepolia \(test\) eip155:84532\s*up to 0\.1 USDC \(100000 atomic\), charged 0\.001 USDC per MiB used0x036CbD53…8f3dCF7e0x209693Bc6afc0C5328bA36FaF03C514EF312287CPay$/);
  const challenge = JSON.parse(await text("#payment-json"));
  const [offer] = challenge.accepts;
  assert.equal(offer.scheme, "upto");
  assert.ok(challenge.extensions.eip2612GasSponsoring, "the 402 offers gas sponsoring");

  const calls = wallet.calls.length, signed = wallet.signed.length;
  await recordReceipt();
  await page.click(`#payment-table button.pay[data-scheme=upto]`);
  await page.waitForSelector("#receipt[data-metered=authorized]", { timeout: 30_000 });
  // Account, chain, balance, Permit2's allowance, the token's permit nonce,
  // then two signatures: Permit2's, then the token's permit.
  assert.deepEqual(wallet.calls.slice(calls), ["eth_requestAccounts", "eth_chainId", "eth_call", "eth_call", "eth_call",
    "eth_signTypedData_v4", "eth_signTypedData_v4"]);
  const [witness, permit] = wallet.signed.slice(signed);
  assert.equal(witness.primaryType, "PermitWitnessTransferFrom");
  assert.deepEqual(witness.domain, { name: "Permit2", chainId: 84532, verifyingContract: PERMIT2 });
  assert.deepEqual(witness.message.permitted, { token: TOKEN, amount: String(METERED.ceiling) });
  assert.equal(witness.message.spender, UPTO_PROXY);
  assert.deepEqual(witness.message.witness, { to: PAY_TO, facilitator: offer.extra.facilitatorAddress, validAfter: "0" });
  assert.match(witness.message.nonce, /^[0-9]+$/);
  const lifetime = Number(witness.message.deadline) - Date.now() / 1000;
  assert.ok(lifetime > offer.maxTimeoutSeconds - 30 && lifetime <= offer.maxTimeoutSeconds, `deadline is now + maxTimeoutSeconds: ${lifetime}`);
  assert.equal(permit.primaryType, "Permit");
  assert.deepEqual(permit.domain, { name: "USDC", version: "2", chainId: 84532, verifyingContract: TOKEN });
  assert.deepEqual(permit.message, { owner: from, spender: PERMIT2, value: String(METERED.ceiling), nonce: "0", deadline: witness.message.deadline });
  // What was sent: the upto payload and the permit as the extension's info.
  assert.equal(sent.length, 1);
  const [payment] = sent;
  assert.deepEqual(payment.accepted, offer);
  assert.deepEqual(payment.payload.permit2Authorization, { from, ...witness.message });
  assert.deepEqual(payment.extensions, { eip2612GasSponsoring: { info: { from, asset: TOKEN, spender: PERMIT2,
    amount: String(METERED.ceiling), nonce: "0", deadline: witness.message.deadline, signature: payment.extensions.eip2612GasSponsoring.info.signature, version: "1" } } });
  assert.match(payment.extensions.eip2612GasSponsoring.info.signature, /^0x[0-9a-f]{130}$/);

  assert.match(await text("#receipt-metered"),
    /^Authorized up to 0\.1 USDC: nothing is charged yet\. When the task ends you are charged what it used, 0\.001 USDC per MiB, at most that; nothing if it fails or is canceled\.$/);
  assert.equal((await text("#receipt-payer")).toLowerCase(), from.toLowerCase());

  // The fetch runs, the worker charges what it downloaded, and the final
  // status event carries the charge.
  await page.waitForSelector("#receipt[data-metered=charged]", { timeout: 60_000 });
  await page.waitForSelector("body[data-finished]", { timeout: 30_000 });
  page.off("request", watchHeaders);
  assert.equal(await page.locator("body").getAttribute("data-finished"), "completed");
  assert.deepEqual(await receiptStates(), ["authorized", "charged"]);
  assert.equal(await text("#receipt-charged"), "0.001501 USDC");
  assert.match(await text("#receipt-metered"), /^Charged 0\.001501 USDC of up to 0\.1 USDC for 1\.5 MiB used\.$/);
  const result = JSON.parse(await text("#result-json"));
  assert.equal(result.sha256, createHash("sha256").update(body).digest("hex"));
  assert.match(await text("#log"), /status completed — charged 0\.001501 USDC/);

  // The chain's own record: one Transfer of exactly the charge, from the
  // payer to payTo, and the payer's balance fell by exactly that; the permit
  // was applied (Permit2 may move what is left of the ceiling), and the
  // payer paid no gas.
  const tx = await text("#receipt-transaction");
  const receipt = await rpc("eth_getTransactionReceipt", [tx]);
  assert.equal(receipt.status, "0x1", JSON.stringify(receipt));
  const transfers = receipt.logs.filter((l) => l.address.toLowerCase() === TOKEN.toLowerCase() && l.topics[0] === TRANSFER);
  assert.deepEqual(transfers.map((t) => [t.topics[1], t.topics[2], BigInt(t.data)]), [[word(from), word(PAY_TO), charge]]);
  assert.equal(await balance(from), METERED_FUNDS - charge, "the payer's balance fell by exactly what was charged");
  assert.equal(await permit2Allowance(from), METERED.ceiling - charge);
  assert.equal(BigInt(await rpc("eth_getBalance", [from, "latest"])), 0n, "the payer spent no gas");
  await page.waitForSelector(`#payments tr[data-transaction="${tx}"]`);
  assert.match(await page.locator(`#payments tr[data-transaction="${tx}"]`).textContent(), /0\.001501 USDC/);
  wallet.reset();
});

test("a metered task that fails is charged nothing: the page shows its authorization released", async () => {
  // Permit2 may move only what is left of the last ceiling now, so this
  // payment signs the token's permit again, with its next nonce.
  const from = await freshMeteredPayer();
  const before = await balance(from);
  const calls = wallet.calls.length, signed = wallet.signed.length;
  // A port nothing listens on: the fetch fails (fetch_unreachable), at once
  // and for good.
  await metered(`http://127.0.0.1:${await freePort()}/file`);
  await recordReceipt();
  await page.click(`#payment-table button.pay[data-scheme=upto]`);
  await page.waitForSelector("#receipt[data-metered=released]", { timeout: 60_000 });
  await page.waitForSelector("body[data-finished=failed]", { timeout: 30_000 });
  assert.deepEqual(await receiptStates(), ["authorized", "released"]);
  assert.equal(wallet.calls.length - calls, 7, wallet.calls.slice(calls).join(" "));
  const [, permit] = wallet.signed.slice(signed);
  assert.equal(permit.message.nonce, "1", "the token's next permit nonce");
  assert.match(await text("#receipt-metered"), /^Nothing was charged: the authorization of up to 0\.1 USDC was released/);
  assert.equal(await page.locator("#receipt-charged").count(), 0);
  assert.match(await text("#log"), /status failed — fetch_unreachable: .* — payment released/);
  assert.equal(await balance(from), before, "nothing was charged");
  wallet.reset();
});

test("a metered tool paid by link: the person authorizes up to the ceiling on the page, the agent's retry gets that task, and it is charged exactly what it used", async () => {
  const from = await freshMeteredPayer();
  // Half a MiB: 500 atomic units at 1000 per MiB.
  const { body, url } = await serveFile(512 * 1024);
  const charge = (BigInt(body.length) * METERED.rate + METERED.unit - 1n) / METERED.unit;
  assert.equal(charge, 500n);
  const { space, agent } = await agentInNewSpace();
  let tab;
  try {
    const args = { url };
    const elicitation = await elicitationOf(agent, "fetch-metered", args);
    assert.match(elicitation.message, /up to/, "the ceiling in words");

    // The person opens the link in a tab of its own (the console's page
    // stays on its Space for the tests after this one).
    const before = await balance(from);
    tab = await withWallet(await context.newPage());
    const shown = (selector) => tab.locator(selector).textContent();
    await tab.goto(elicitation.url);
    await tab.waitForSelector("body[data-pay-link=open]");
    assert.equal(await shown("#pay-link-kind"), "fetch-metered");
    assert.deepEqual(JSON.parse(await shown("#pay-link-input")), args);
    assert.match(await shown("#pay-link-price"), /^up to 0\.1 USDC.* on Base Sepolia \(test\) \(eip155:84532\): charged when the task ends, for what it used; nothing if it fails$/);
    await tab.click("#payment-table button.pay[data-scheme=upto]");
    await tab.waitForSelector("body[data-pay-link=paid]", { timeout: 30_000 });
    const task = await tab.locator("#pay-link-status").getAttribute("data-task");

    // The agent's retry, with the same arguments: the task the page bought.
    const retried = await agent.callTool({ name: "fetch-metered", arguments: args });
    assert.notEqual(retried.isError, true, JSON.stringify(retried));
    assert.equal(retried.structuredContent.id, task);
    assert.equal(retried.structuredContent.payment.scheme, "upto");

    // It runs in the agent's Space and is charged what it downloaded, once.
    let ended;
    for (const until = Date.now() + 60_000; Date.now() < until; await new Promise((ok) => setTimeout(ok, 250))) {
      const res = await fetch(`${base}/v1/tasks/${task}`, { headers: { authorization: `Bearer ${space.token}` } });
      const read = await res.json();
      if (read.status === "completed" && read.payment && read.payment.status === "charged") { ended = read; break; }
      assert.ok(!["failed", "canceled"].includes(read.status), JSON.stringify(read));
    }
    assert.ok(ended, "completed and charged within 60 s");
    assert.equal(ended.result.sha256, createHash("sha256").update(body).digest("hex"));
    assert.equal(ended.payment.charged, String(charge));
    assert.equal(await balance(from), before - charge, "charged exactly what it used");
  } finally {
    await agent.close();
    await tab?.close();
    wallet.reset();
  }
});
test("the task list shows the Space's tasks, and a queued one is canceled", async () => {
  await page.click("#tasks-refresh");
  await page.waitForSelector("#tasks tbody tr[data-status=completed]");

  // With no worker a new task stays queued, so the cancel is certain to
  // find it so.
  await stop(worker);
  await choose("digest");
  await upload("later.txt", Buffer.from("cancel me\n"), "text/plain");
  await page.click("#task-create");
  await page.waitForSelector("#tasks tbody tr[data-status=queued] button.cancel");
  await shot("5-tasks");
  await page.click("#tasks tbody tr[data-status=queued] button.cancel");
  await page.waitForSelector("#tasks tbody tr[data-status=canceled]");
  await page.waitForSelector("body[data-finished=canceled]");
  assert.match(await text("#notice"), /is canceled/);
});

test("Cancel selected: the ticked queued tasks are canceled in one request, and the one left unticked stays queued", async () => {
  // The worker is still stopped: new tasks stay queued.
  const made = [];
  // The page watches each task it creates: a new id there is the new task.
  const seen = [await page.locator("body").getAttribute("data-watching")];
  for (const name of ["bulk-a.txt", "bulk-b.txt", "bulk-c.txt"]) {
    await choose("digest");
    await upload(name, Buffer.from(`cancel ${name} with the others\n`), "text/plain");
    await page.click("#task-create");
    await page.waitForFunction((known) => document.body.dataset.watching && !known.includes(document.body.dataset.watching), seen);
    const id = await page.locator("body").getAttribute("data-watching");
    made.push(id); seen.push(id);
  }
  await page.click("#tasks-refresh");
  for (const id of made) await page.waitForSelector(`#tasks tbody tr[data-task="${id}"][data-status=queued] input.pick`);
  assert.equal(await page.locator("#tasks-cancel").isDisabled(), true, "nothing ticked, nothing to cancel");
  const sent = [];
  const record = (r) => { if (new URL(r.url()).pathname === "/v1/tasks/cancel") sent.push(r.postDataJSON()); };
  page.on("request", record);
  await page.check(`#tasks tbody tr[data-task="${made[0]}"] input.pick`);
  await page.check(`#tasks tbody tr[data-task="${made[1]}"] input.pick`);
  assert.equal(await page.locator("#tasks-cancel").isDisabled(), false);
  await page.click("#tasks-cancel");
  await page.waitForSelector(`#tasks tbody tr[data-task="${made[0]}"][data-status=canceled]`);
  await page.waitForSelector(`#tasks tbody tr[data-task="${made[1]}"][data-status=canceled]`);
  page.off("request", record);
  assert.equal(sent.length, 1, "one request for both");
  assert.deepEqual(new Set(sent[0].ids), new Set([made[0], made[1]]));
  assert.match(await text("#notice"), /^2 canceled\.$/);
  assert.equal(await page.locator("#tasks-cancel").isDisabled(), true);
  assert.equal(await page.locator(`#tasks tbody tr[data-task="${made[2]}"]`).getAttribute("data-status"), "queued");
  const statuses = Object.fromEntries((await tasks()).map((t) => [t.id, t.status]));
  assert.deepEqual(made.map((id) => statuses[id]), ["canceled", "canceled", "queued"], "as the server has them");
  await page.click(`#tasks tbody tr[data-task="${made[2]}"] button.cancel`);
  await page.waitForSelector(`#tasks tbody tr[data-task="${made[2]}"][data-status=canceled]`);
});

test("a paid task canceled before it ran leaves a credit, which pays the next one with no wallet asked", async () => {
  // The worker is still stopped: the paid task stays queued.
  wallet.reset(); wallet.chainId = 84532;
  const before = await balance(payer);
  await priced("credit.bin");
  await payLocal();
  await page.waitForSelector("#receipt[data-paid=payment]", { timeout: 30_000 });
  const paid = await page.locator("body").getAttribute("data-watching");
  await page.click(`#tasks tbody tr[data-task="${paid}"] button.cancel`);
  await page.waitForSelector("body[data-finished=canceled]");
  await page.waitForSelector(`#credits tr[data-spent=false]`);
  assert.equal(await balance(payer), before - PRICE);

  const asked = wallet.calls.length;
  await choose("paid-digest");
  await upload("free-now.bin", randomBytes(100));
  await page.click("#task-create");
  await page.waitForSelector("#receipt[data-paid=credit]");
  const next = await page.locator("body").getAttribute("data-watching");
  assert.notEqual(next, paid);
  await page.waitForSelector(`#credits tr[data-spent=true]`);
  // The receipt names the credit once the page has read the Space, and the
  // log line comes over the task's event stream: both arrive on their own
  // time, so the test waits for them rather than reading at once.
  await page.waitForSelector("#receipt-credit:has-text('from task')");
  await page.waitForSelector("#log div:has-text('paid with a credit')", { timeout: 30_000 });
  assert.match(await text("#receipt-credit"),
    new RegExp(`^Paid with a credit this Space held.*no wallet\\. It was 0\\.01 USDC on Base Sepolia \\(test\\) \\(eip155:84532\\), from task ${paid} \\(canceled\\)\\.$`));
  assert.equal(await page.locator("#payment").isHidden(), true, "no payment table");
  assert.equal(wallet.calls.length, asked, "the wallet was asked nothing");
  assert.equal(await balance(payer), before - PRICE, "nothing more was charged");
  assert.match(await text("#log"), /paid with a credit: 0\.01 USDC on Base Sepolia \(test\) \(eip155:84532\), left by task /);
});

test("Rotate the Space ID asks first, then shows the new ID once; the old one opens nothing and the tasks stay", async () => {
  const oldId = await page.evaluate(() => state.spaceId);
  const oldToken = await page.evaluate(() => state.token);
  const tasksBefore = await page.locator("#tasks tbody tr").count();
  assert.ok(tasksBefore > 0);

  // Dismissed: nothing is sent, nothing changes.
  const sent = [];
  const record = (request) => { if (request.url().endsWith("/v1/space/rotate")) sent.push(request.url()); };
  page.on("request", record);
  page.once("dialog", (dialog) => dialog.dismiss());
  await page.click("#space-rotate");
  await page.waitForFunction(() => /not rotated/.test(document.getElementById("notice").textContent));
  assert.deepEqual(sent, []);
  assert.equal(await page.evaluate(() => state.spaceId), oldId);

  // Confirmed: the new ID is shown, and the page goes on with its session.
  let asked = "";
  page.once("dialog", (dialog) => { asked = dialog.message(); dialog.accept(); });
  await page.click("#space-rotate");
  await page.waitForSelector("body[data-rotated=yes]");
  page.off("request", record);
  assert.equal(sent.length, 1);
  assert.match(asked, /old ID stops working/);
  const newId = await text("#space-id-shown");
  assert.match(newId, /^[0-9]{20}$/);
  assert.notEqual(newId, oldId);
  assert.match(await text("#space-new"), /Your rotated Space ID/);

  const login = (spaceId) => fetch(`${base}/v1/sessions`, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ space_id: spaceId }),
  });
  assert.equal((await login(oldId)).status, 401, "the old ID opens nothing");
  assert.equal((await login(newId)).status, 200, "the new one opens the Space");
  const before = await fetch(`${base}/v1/space`, { headers: { authorization: `Bearer ${oldToken}` } });
  assert.equal(before.status, 401, "the session from before is ended");
  // So is every share link made before.
  if (shared) {
    const ticket = await fetch(`${base}/v1/tasks/${shared.task}/ticket`, { method: "POST", headers: { authorization: `Share ${shared.share}` } });
    assert.equal(ticket.status, 401, "a share link from before the rotation");
    assert.equal((await ticket.json()).error.code, "invalid_share");
  }

  await page.click("#tasks-refresh");
  await page.waitForFunction((n) => document.querySelectorAll("#tasks tbody tr").length === n, tasksBefore);
});

// ---------------------------------------------------------------- pay links
// The official TypeScript MCP SDK as a desktop agent uses it: no wallet, URL
// elicitation declared, and the session token of a Space of its own.
async function mcpAgent(token) {
  const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
  const { StreamableHTTPClientTransport } = await import("@modelcontextprotocol/sdk/client/streamableHttp.js");
  const client = new Client({ name: "reeve-console-agent", version: "1.0.0" }, { capabilities: { elicitation: { url: {} } } });
  const headers = token ? { authorization: `Bearer ${token}` } : {};
  await client.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`), { requestInit: { headers } }));
  return client;
}
// A new Space, made through MCP, and an agent in it.
async function agentInNewSpace() {
  const anonymous = await mcpAgent();
  const space = (await anonymous.callTool({ name: "create_space", arguments: {} })).structuredContent;
  await anonymous.close();
  const agent = await mcpAgent(space.token);
  await agent.listTools();
  return { space, agent };
}
// The URL elicitation a call of the priced `tool` is refused with.
async function elicitationOf(agent, tool, args) {
  const { ErrorCode, UrlElicitationRequiredError } = await import("@modelcontextprotocol/sdk/types.js");
  let elicitation;
  await assert.rejects(agent.callTool({ name: tool, arguments: args }), (e) => {
    assert.ok(e instanceof UrlElicitationRequiredError, `${e}`);
    assert.equal(e.code, ErrorCode.UrlElicitationRequired);
    [elicitation] = e.elicitations;
    return true;
  });
  assert.equal(elicitation.mode, "url");
  return elicitation;
}
test("an MCP client without x402 that declares URL elicitation gets a pay link; a person pays it on the page, and the retried call returns that task: one charge, one task", async () => {
  const { space, agent } = await agentInNewSpace();
  try {
    const bytes = Buffer.from("a digest an agent asked for, paid by a person\n");
    const stored = (await agent.callTool({ name: "create_upload", arguments: {
      filename: "agent.txt", content_type: "text/plain", content_base64: bytes.toString("base64") } })).structuredContent;
    const args = { upload_id: stored.upload_id };
    const elicited = () => elicitationOf(agent, "paid-digest", args);
    const elicitation = await elicited();
    const link = new URL(elicitation.url);
    assert.equal(link.origin, base, "the console beside the endpoint");
    assert.match(link.hash, /^#pay=[0-9A-HJKMNP-TV-Z]{26}\.[A-Za-z0-9_-]{22}$/);
    for (const secret of [space.token, space.space_id]) assert.ok(!elicitation.url.includes(secret), "no credential in the link");
    assert.match(elicitation.message, /paid-digest again with the same arguments/);
    // Asked again before anyone paid: the same link, not a second one.
    assert.equal((await elicited()).url, elicitation.url);

    // A person opens the link in their browser and pays with their wallet.
    wallet.reset(); wallet.chainId = 84532;
    const before = await balance(payer);
    await page.goto("about:blank");
    await page.goto(elicitation.url);
    await page.waitForSelector("body[data-pay-link=open]");
    assert.equal(await page.locator("#space-section").isHidden(), true, "no Space is needed to pay");
    assert.equal(await text("#pay-link-kind"), "paid-digest");
    assert.deepEqual(JSON.parse(await text("#pay-link-input")), args, "what the agent asked for");
    assert.equal(await text("#pay-link-digest"), createHash("sha256").update(JSON.stringify(args)).digest("hex"));
    assert.match(await text("#pay-link-price"), /^0\.01 USDC on Base Sepolia \(test\) \(eip155:84532\)/);
    assert.match(await text("#pay-link-next"), /the agent's next call of the tool gets it/);
    await shot("8-pay-link");
    await payLocal();
    await page.waitForSelector("body[data-pay-link=paid]", { timeout: 30_000 });
    const task = await page.locator("#pay-link-status").getAttribute("data-task");
    assert.equal(await text("#receipt-payer"), payer.toLowerCase());
    assert.equal(await balance(payer), before - PRICE, "charged the price, once");
    // With no session, "verify" checks the receipt the payment was answered
    // with, against the catalog's published signer.
    await page.click("#receipt-verify");
    await page.waitForSelector("#receipt-verified[data-verified=true]");
    assert.equal(await text("#receipt-signer"), (await (await fetch(`${base}/v1/catalog`)).json()).receipts.signer);
    assert.ok((await text("#receipt-verified")).includes(`${task} (paid-digest)`), "the receipt of this task");

    // The agent calls again, with the same arguments: the task the page bought.
    const retried = await agent.callTool({ name: "paid-digest", arguments: args });
    assert.notEqual(retried.isError, true, JSON.stringify(retried));
    assert.equal(retried.structuredContent.id, task);
    assert.equal(retried._meta["x402/payment-response"].payer, payer.toLowerCase(), "with the receipt of its payment");
    assert.equal((await agent.callTool({ name: "paid-digest", arguments: args })).structuredContent.id, task);
    const listed = (await agent.callTool({ name: "list_tasks", arguments: {} })).structuredContent.tasks;
    assert.deepEqual(listed.map((t) => t.id), [task], "one task in the agent's Space");

    // The link is spent: opened again, it says so and charges nothing.
    await page.goto("about:blank");
    await page.goto(elicitation.url);
    await page.waitForSelector("#pay-link-status[data-code=pay_link_used]");
    assert.equal(await page.locator("#payment").isHidden(), true, "nothing to pay");
    assert.equal(await balance(payer), before - PRICE, "nothing more was charged");
  } finally {
    await agent.close();
  }
});
