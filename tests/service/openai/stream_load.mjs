// Load tool (not a test): CLIENTS concurrent streaming chat clients through the official SDK,
// each sending REQUESTS requests one after another; prints time to first token and
// inter-token latency percentiles and the token rate, as JSON.
// Run from the build's openai-client dir (where the SDK is installed):
//   node stream_load.mjs BASE_URL API_KEY MODEL [CLIENTS=64] [REQUESTS=2] [MAX_TOKENS=64]
import OpenAI from "openai";

const [baseURL, apiKey, model, clients = "64", requests = "2", maxTokens = "64"] =
  process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 600_000 });
const ttft = [];
const itl = [];
let tokens = 0;

async function one(c, r) {
  const t0 = performance.now();
  let last = null;
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: `Client ${c} request ${r}: tell me about experts.` }],
    max_tokens: Number(maxTokens),
    temperature: 1,
    top_k: 20,
    seed: c * 1000 + r,
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    if (chunk.usage) tokens += chunk.usage.completion_tokens;
    if (!chunk.choices.length || !chunk.choices[0].delta.content) continue;
    const now = performance.now();
    if (last === null) ttft.push(now - t0);
    else itl.push(now - last);
    last = now;
  }
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? +s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)].toFixed(2) : null;
};
const start = performance.now();
await Promise.all(
  Array.from({ length: Number(clients) }, async (_, c) => {
    for (let r = 0; r < Number(requests); r++) await one(c, r);
  }),
);
const wall = (performance.now() - start) / 1000;
console.log(
  JSON.stringify({
    clients: Number(clients),
    requests: Number(clients) * Number(requests),
    wall_s: +wall.toFixed(2),
    tokens_per_s: +(tokens / wall).toFixed(1),
    ttft_ms: { p50: pct(ttft, 50), p99: pct(ttft, 99) },
    itl_ms: { p50: pct(itl, 50), p99: pct(itl, 99) },
  }),
);
