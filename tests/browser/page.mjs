// Runs examples/node/greedy.mjs with the page's query (?model=&prompt=&max=) as its
// command line and onnxruntime-web as its ORT_PACKAGE; what it prints goes to
// window.needle.stdout (window.needle.error if it throws).
const query = new URLSearchParams(location.search);
globalThis.process = {
  argv: ["node", "greedy.mjs", query.get("model"), query.get("prompt"), query.get("max")],
  env: { ORT_PACKAGE: "onnxruntime-web" },
};
const printed = [];
console.log = (...parts) => printed.push(parts.join(" "));
try {
  await import("/examples/node/greedy.mjs");
  window.needle = { stdout: printed.join("\n") };
} catch (e) {
  window.needle = { error: String(e?.stack ?? e) };
}
