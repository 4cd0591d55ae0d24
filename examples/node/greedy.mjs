// Greedy generation with an fp32 needle-export graph in onnxruntime-node, or in
// onnxruntime-web (wasm) with ORT_PACKAGE=onnxruntime-web.
// Usage: node greedy.mjs MODEL.onnx '[2, 369, …]' [MAX_NEW_TOKENS]
// (prompt token ids with BOS, e.g. from needle-run --raw TEXT --json). Prints the generated ids.
import { readFileSync } from "node:fs";

const ort = await import(process.env.ORT_PACKAGE ?? "onnxruntime-node");
const [modelPath, promptJson, maxNew = "32"] = process.argv.slice(2);
const session = await ort.InferenceSession.create(readFileSync(modelPath));
const meta = Object.fromEntries(
  session.inputNames.map((name, i) => [name, session.inputMetadata[i]]),
);
const eos = 1; // Needle's tokenizers: PAD 0, EOS 1, BOS 2, UNK 3

// Empty state: no past tokens.
const feeds = {};
for (const [name, info] of Object.entries(meta)) {
  if (!name.startsWith("past_")) continue;
  const shape = info.shape.map((d) => (d === "batch" ? 1 : d === "past_sequence" ? 0 : d));
  const size = shape.reduce((a, b) => a * b, 1);
  feeds[name] = info.type === "int64"
    ? new ort.Tensor("int64", new BigInt64Array(size), shape)
    : new ort.Tensor("float32", new Float32Array(size), shape);
}

let ids = JSON.parse(promptJson);
let past = 0;
const generated = [];
while (generated.length < Number(maxNew)) {
  const n = ids.length;
  const range = (from, count) => BigInt64Array.from({ length: count }, (_, i) => BigInt(from + i));
  feeds.input_ids = new ort.Tensor("int64", BigInt64Array.from(ids.map(BigInt)), [1, n]);
  feeds.attention_mask = new ort.Tensor("int64", new BigInt64Array(past + n).fill(1n), [1, past + n]);
  feeds.position_ids = new ort.Tensor("int64", range(past, n), [1, n]);
  const out = await session.run(feeds);
  const logits = out.logits;
  const vocab = logits.dims[2];
  const last = logits.data.subarray((n - 1) * vocab, n * vocab);
  let next = 0;
  for (let i = 1; i < vocab; i++) if (last[i] > last[next]) next = i;
  if (next === eos) break;
  generated.push(next);
  // present.X -> past_key_values.X (the KV cache, token history included)
  for (const [name, value] of Object.entries(out)) {
    if (name.startsWith("present.")) feeds["past_key_values." + name.slice(8)] = value;
  }
  past += n;
  ids = [next];
}
console.log(JSON.stringify(generated));
