// The `node:fs` the example reads its model with: the page's model, fetched before the
// example starts (readFileSync is synchronous; a module may wait at its top level).
const model = new URLSearchParams(location.search).get("model");
const bytes = new Uint8Array(await (await fetch(model)).arrayBuffer());

export function readFileSync(path) {
  if (path !== model) throw new Error(`the page serves only ${model}, not ${path}`);
  return bytes;
}
