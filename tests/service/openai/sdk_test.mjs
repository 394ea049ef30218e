// Drives `moebatch serve` through the official OpenAI SDK for Node, as an application would.
// Run by tests/service/test_openai_sdk.cpp: node sdk_test.mjs BASE_URL API_KEY MODEL
// Prints one JSON line per check and a last line {"ok": true, ...}; exits 1 on a failed check.
// Jobs it leaves (the C++ test counts them): 5 done API requests and 1 cancelled (the abort);
// batch 1: 6 done + 1 failed; batch 2: 3 cancelled; a third batch fails validation (no jobs).
import assert from "node:assert/strict";
import OpenAI, { toFile } from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const log = (o) => console.log(JSON.stringify(o));

async function main() {
  // Models: the loaded one, with its context length.
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  assert.equal(models.length, 1);
  assert.equal(models[0].id, model);
  assert.ok(models[0].max_model_len > 0);
  assert.equal((await client.models.retrieve(model)).id, model);
  log({ check: "models", id: models[0].id, max_model_len: models[0].max_model_len });

  // Chat, whole and streamed: the same draws give the same text; usage agrees.
  const chat = {
    model,
    messages: [
      { role: "system", content: "Answer briefly." },
      { role: "user", content: "What is a mixture of experts?" },
    ],
    temperature: 1,
    top_p: 0.95,
    top_k: 40,
    seed: 7,
    max_tokens: 24,
  };
  const full = await client.chat.completions.create(chat);
  assert.equal(full.object, "chat.completion");
  assert.equal(full.choices.length, 1);
  assert.equal(full.choices[0].message.role, "assistant");
  assert.equal(full.usage.completion_tokens, 24);
  const text = full.choices[0].message.content;
  log({ check: "chat", id: full.id, chars: text.length });

  const stream = await client.chat.completions.create({
    ...chat,
    stream: true,
    stream_options: { include_usage: true },
  });
  let streamed = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    streamed += chunk.choices[0].delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(streamed, text);
  assert.equal(finish, "length");
  assert.equal(usage.completion_tokens, full.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, full.usage.prompt_tokens);
  assert.ok(chunks > 3);
  log({ check: "chat_stream", chunks });

  // Completions, whole and streamed.
  const cmpl = { model, prompt: "Once upon a time", max_tokens: 8, temperature: 0 };
  const c = await client.completions.create(cmpl);
  assert.equal(c.object, "text_completion");
  assert.equal(c.usage.completion_tokens, 8);
  let ctext = "";
  for await (const chunk of await client.completions.create({ ...cmpl, stream: true }))
    ctext += chunk.choices[0]?.text ?? "";
  assert.equal(ctext, c.choices[0].text);
  log({ check: "completions", id: c.id });

  // Errors come back as the SDK's typed errors.
  await assert.rejects(client.chat.completions.create({ ...chat, n: 2 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.param, "n");
    return true;
  });
  await assert.rejects(client.chat.completions.create({ ...chat, model: "gpt-4o" }), (e) =>
    e instanceof OpenAI.NotFoundError);
  const wrong = new OpenAI({ baseURL, apiKey: "not-the-key", maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  log({ check: "errors" });

  // A client that gives up mid-stream: the server must cancel the job.
  const long = await client.chat.completions.create({
    ...chat,
    max_tokens: 3000,
    top_k: 20,
    stream: true,
  });
  let abortedId = null;
  let seen = 0;
  for await (const chunk of long) {
    abortedId = chunk.id;
    if (++seen === 3) break;  // leaving the loop aborts the request
  }
  long.controller.abort();
  log({ check: "abort", id: abortedId, chunks_seen: seen });

  // The Batch API: upload, create, poll to completed, download the output and error files.
  const batchId = await batchRoundTrip();
  log({ ok: true, aborted_id: abortedId, batch_id: batchId });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const lines = async (fileId) =>
  (await (await client.files.content(fileId)).text()).trim().split("\n").map((l) => JSON.parse(l));

async function upload(requests, name) {
  const jsonl = requests.map((r) => JSON.stringify(r)).join("\n") + "\n";
  const file = await client.files.create({
    file: await toFile(Buffer.from(jsonl), name),
    purpose: "batch",
  });
  assert.equal(file.purpose, "batch");
  assert.equal(file.bytes, Buffer.byteLength(jsonl));
  return file;
}

async function waitFor(batch, status) {
  const deadline = Date.now() + 60_000;
  while (batch.status !== status) {
    assert.ok(Date.now() < deadline, `batch ${batch.id} still ${batch.status}`);
    await sleep(100);
    batch = await client.batches.retrieve(batch.id);
  }
  return batch;
}

async function batchRoundTrip() {
  const url = "/v1/chat/completions";
  const requests = [];
  for (let i = 0; i < 6; i++) {
    requests.push({
      custom_id: `req-${i}`,
      method: "POST",
      url,
      body: { model, messages: [{ role: "user", content: `Question ${i}` }], max_tokens: 6, temperature: 0 },
    });
  }
  // Valid as a request, but longer than the context: it fails when it runs.
  requests.push({
    custom_id: "too-long",
    method: "POST",
    url,
    body: { model, messages: [{ role: "user", content: "x" }], max_tokens: 32768 },
  });
  const file = await upload(requests, "requests.jsonl");
  assert.equal((await client.files.retrieve(file.id)).filename, "requests.jsonl");
  const uploads = [];
  for await (const f of client.files.list({ purpose: "batch" })) uploads.push(f.id);
  assert.ok(uploads.includes(file.id));
  let batch = await client.batches.create({
    input_file_id: file.id,
    endpoint: url,
    completion_window: "24h",
    metadata: { run: "sdk-test" },
  });
  assert.equal(batch.request_counts.total, 7);
  assert.deepEqual(batch.metadata, { run: "sdk-test" });
  batch = await waitFor(batch, "completed");
  assert.deepEqual(batch.request_counts, { total: 7, completed: 6, failed: 1 });
  const out = await lines(batch.output_file_id);
  assert.deepEqual(
    out.map((l) => l.custom_id).sort(),
    requests.slice(0, 6).map((r) => r.custom_id).sort(),
  );
  for (const l of out) {
    assert.equal(l.error, null);
    assert.equal(l.response.status_code, 200);
    assert.equal(l.response.body.object, "chat.completion");
    assert.equal(l.response.body.usage.completion_tokens, 6);
  }
  // The same request made directly gives the same text (greedy).
  const direct = await client.chat.completions.create(requests[0].body);
  assert.equal(
    out.find((l) => l.custom_id === "req-0").response.body.choices[0].message.content,
    direct.choices[0].message.content,
  );
  const err = await lines(batch.error_file_id);
  assert.equal(err.length, 1);
  assert.equal(err[0].custom_id, "too-long");
  assert.equal(err[0].response, null);
  assert.ok(err[0].error.message.includes("context"), err[0].error.message);
  const listed = [];
  for await (const b of client.batches.list({ limit: 1 })) listed.push(b.id);  // pages of one
  assert.ok(listed.includes(batch.id));
  log({ check: "batch", id: batch.id, listed: listed.length });

  // Cancel: long requests, cancelled at once; nothing of them is left running.
  const long = [0, 1, 2].map((i) => ({
    custom_id: `long-${i}`,
    method: "POST",
    url,
    body: { model, messages: [{ role: "user", content: "Go on" }], max_tokens: 3000, top_k: 20 },
  }));
  let cancelled = await client.batches.create({
    input_file_id: (await upload(long, "long.jsonl")).id,
    endpoint: url,
    completion_window: "24h",
  });
  cancelled = await client.batches.cancel(cancelled.id);
  assert.ok(["cancelling", "cancelled"].includes(cancelled.status), cancelled.status);
  cancelled = await waitFor(cancelled, "cancelled");
  assert.equal(cancelled.request_counts.failed, 3);
  assert.equal((await lines(cancelled.error_file_id))[0].error.code, "cancelled");
  log({ check: "batch_cancel", id: cancelled.id });

  // A bad file: the batch fails naming the line, and nothing is queued.
  const bad = await upload([{ custom_id: "x" }], "bad.jsonl");
  const failed = await client.batches.create({
    input_file_id: bad.id,
    endpoint: url,
    completion_window: "24h",
  });
  assert.equal(failed.status, "failed");
  assert.equal(failed.errors.data[0].line, 1);
  await client.files.delete(bad.id);
  await assert.rejects(client.files.retrieve(bad.id), (e) => e instanceof OpenAI.NotFoundError);
  log({ check: "batch_errors" });
  return batch.id;
}

main().catch((e) => {
  log({ ok: false, error: String(e?.stack ?? e) });
  process.exit(1);
});
