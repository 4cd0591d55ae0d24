// examples/node/greedy.mjs in headless Chromium with onnxruntime-web's wasm build, as a
// page would run it: serves the repository and MODEL.onnx on a loopback port, opens
// greedy.html in Chromium (driven by playwright-core) and prints what the example printed.
// Usage: node run.mjs MODEL.onnx '[2, 369, …]' [MAX_NEW_TOKENS]
// Chromium: $CHROMIUM, else /usr/bin/chromium (Debian's package; scripts/setup installs it).
import { createReadStream, existsSync, statSync } from "node:fs";
import { createServer } from "node:http";
import { extname, join, normalize, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const [modelPath, promptJson, maxNew = "32"] = process.argv.slice(2);
const root = fileURLToPath(new URL("../..", import.meta.url));
const types = {
  ".html": "text/html",
  ".mjs": "text/javascript",
  ".js": "text/javascript",
  ".wasm": "application/wasm",
  ".onnx": "application/octet-stream",
};

const server = createServer((req, res) => {
  const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
  const file = path === "/model.onnx" ? modelPath : normalize(join(root, path));
  const inside = file === modelPath || file.startsWith(root.endsWith(sep) ? root : root + sep);
  if (!inside || !existsSync(file) || !statSync(file).isFile()) {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, { "content-type": types[extname(file)] ?? "application/octet-stream" });
  createReadStream(file).pipe(res);
});
await new Promise((done) => server.listen(0, "127.0.0.1", done));

// Flags without which Chromium keeps reaching for Google's hosts on a closed network.
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
let failed = false;
try {
  const page = await browser.newPage();
  const query = new URLSearchParams({ model: "/model.onnx", prompt: promptJson, max: maxNew });
  const { port } = server.address();
  await page.goto(`http://127.0.0.1:${port}/tests/browser/greedy.html?${query}`);
  await page.waitForFunction(() => window.needle, null, { timeout: 300_000 });
  const result = await page.evaluate(() => window.needle);
  if (result.error) {
    console.error(result.error);
    failed = true;
  } else {
    console.log(result.stdout);
  }
} finally {
  await browser.close();
  server.close();
}
process.exit(failed ? 1 : 0);
