// The official `openai` npm client (pinned in package.json / package-lock.json) against
// `litellama serve` on the embedded default model (CPU, an API key set). Every check can fail;
// the first failure ends the run with status 1.
//
// usage: node openai_client_test.mjs BIN_DIR
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, openSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";
import OpenAI from "openai";

const KEY = "sk-client-test";
const binDir = process.argv[2];

function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function metric(base, name) {
  const r = await fetch(base + "/metrics", { headers: { Authorization: "Bearer " + KEY } });
  const m = (await r.text()).match(new RegExp("^" + name + " (\\S+)$", "m"));
  return m ? Number(m[1]) : -1;
}

async function expectStatus(promise, status, param) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, String(e));
    assert.equal(e.status, status, e.message);
    if (param !== undefined) assert.equal(e.param, param, e.message);
    return e;
  }
  assert.fail("expected HTTP " + status);
}

const work = mkdtempSync(join(tmpdir(), "litellama-openai-"));
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const log = openSync(join(work, "serve.log"), "w");
const serve = spawn(join(binDir, "litellama"),
  ["serve", "--run-dir", join(work, "run"), "--metrics-port", "0", "--port", String(port),
   "--api-key", KEY, "--served-model-name", "litellama-test", "--threads", "1"],
  { stdio: ["ignore", log, log] });
let failed = false;
try {
  for (let i = 0; ; ++i) {
    const r = await fetch(base + "/ready", { headers: { Authorization: "Bearer " + KEY } })
      .catch(() => null);
    if (r && r.status === 200) break;
    assert.ok(i < 300, "the server was not ready in 60 s");
    await sleep(200);
  }
  const client = new OpenAI({ baseURL: base + "/v1", apiKey: KEY, maxRetries: 0 });
  const model = "litellama-test";

  // models.list
  const models = [];
  for await (const m of client.models.list()) models.push(m.id);
  assert.deepEqual(models, [model]);

  // chat, not streaming, with usage
  const messages = [{ role: "user", content: "Say something" }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 6,
    temperature: 0, ignore_eos: true });
  assert.equal(chat.object, "chat.completion");
  assert.equal(chat.choices[0].message.role, "assistant");
  assert.equal(chat.choices[0].finish_reason, "length");
  assert.equal(chat.usage.completion_tokens, 6);

  // chat, streaming: the same text, role first, finish_reason last, usage chunk
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 6,
    temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
  let text = "", role = null, finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    role = role ?? chunk.choices[0].delta.role;
    text += chunk.choices[0].delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(role, "assistant");
  assert.equal(text, chat.choices[0].message.content);
  assert.equal(finish, "length");
  assert.equal(usage.completion_tokens, 6);

  // completions; n > 1; seed reproducibility (choice i samples with seed + i)
  const comp = await client.completions.create({ model, prompt: "Once upon a time",
    max_tokens: 5, ignore_eos: true });
  assert.equal(comp.usage.completion_tokens, 5);
  const sampled = { model, prompt: "Pick", max_tokens: 8, temperature: 1, seed: 7, n: 3,
    ignore_eos: true };
  const a = await client.completions.create(sampled);
  const b = await client.completions.create(sampled);
  assert.equal(a.choices.length, 3);
  assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
  const shifted = await client.completions.create({ ...sampled, seed: 8, n: 1 });
  assert.equal(shifted.choices[0].text, a.choices[1].text);

  // stop
  const full = (await client.completions.create({ model, prompt: "List:", max_tokens: 12,
    temperature: 0, ignore_eos: true })).choices[0].text;
  // An ASCII character that first appears after the start, so that the stopped text is not empty
  // (a stop string ends the text at its first occurrence).
  let stopAt;
  for (let i = 1; i < full.length && stopAt === undefined; i++) {
    if (full.charCodeAt(i) < 128 && full.indexOf(full[i]) === i) stopAt = full[i];
  }
  assert.ok(stopAt, "no ASCII character to stop at in " + JSON.stringify(full));
  const stopped = await client.completions.create({ model, prompt: "List:", max_tokens: 12,
    temperature: 0, ignore_eos: true, stop: [stopAt] });
  assert.equal(stopped.choices[0].text, full.slice(0, full.indexOf(stopAt)));
  assert.equal(stopped.choices[0].finish_reason, "stop");

  // logprobs: chat (content[] with top_logprobs, streaming and not) and completions (legacy)
  const lpChat = await client.chat.completions.create({ model, max_tokens: 4, temperature: 0,
    ignore_eos: true, logprobs: true, top_logprobs: 2,
    messages: [{ role: "user", content: "Hi" }] });
  const content = lpChat.choices[0].logprobs.content;
  assert.equal(content.length, 4);
  for (const t of content) {
    assert.ok(t.logprob <= 0, JSON.stringify(t));
    assert.equal(t.top_logprobs.length, 2);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
    assert.equal(t.token, t.top_logprobs[0].token);  // greedy: the most likely token
    assert.ok(Array.isArray(t.bytes));
  }
  const lpStream = await client.chat.completions.create({ model, max_tokens: 4, temperature: 0,
    ignore_eos: true, logprobs: true, top_logprobs: 2, stream: true,
    messages: [{ role: "user", content: "Hi" }] });
  const streamedLp = [];
  for await (const chunk of lpStream) {
    const lp = chunk.choices[0]?.logprobs;
    if (lp) streamedLp.push(...lp.content);
  }
  assert.deepEqual(streamedLp.map((t) => t.token), content.map((t) => t.token));
  const lpCompletion = await client.completions.create({ model, prompt: "Once", max_tokens: 3,
    temperature: 0, ignore_eos: true, logprobs: 1 });
  const legacy = lpCompletion.choices[0].logprobs;
  assert.equal(legacy.tokens.length, 3);
  assert.equal(legacy.token_logprobs.length, 3);
  assert.equal(legacy.top_logprobs.length, 3);
  assert.equal(legacy.text_offset[0], 0);
  await expectStatus(client.chat.completions.create({ model, max_tokens: 2, top_logprobs: 3,
    messages: [{ role: "user", content: "Hi" }] }), 400, "top_logprobs");

  // abort through AbortController: the request ends on the server, its KV freed
  const controller = new AbortController();
  const long = await client.chat.completions.create({ model, messages, max_tokens: 2000,
    ignore_eos: true, stream: true }, { signal: controller.signal });
  let seen = 0;
  try {
    for await (const chunk of long) {
      if (++seen === 3) controller.abort();
    }
  } catch (e) {
    assert.ok(e.name === "APIUserAbortError" || e.name === "AbortError", String(e));
  }
  const t0 = Date.now();
  while ((await metric(base, "litellama_scheduler_requests_running")) !== 0 ||
         (await metric(base, "litellama_scheduler_kv_slots_used")) !== 0) {
    assert.ok(Date.now() - t0 < 1000, "the aborted request still holds KV after 1 s");
    await sleep(20);
  }

  // errors
  await expectStatus(new OpenAI({ baseURL: base + "/v1", apiKey: "wrong", maxRetries: 0 })
    .models.list(), 401);
  await expectStatus(client.chat.completions.create({ model: "nope", messages }), 404, "model");
  await expectStatus(client.chat.completions.create({ model, messages,
    tools: [{ type: "function", function: { name: "f" } }] }), 400, "tools");
  await expectStatus(client.chat.completions.create({ model, messages, temperature: 5 }), 400,
    "temperature");
  await expectStatus(client.completions.create({ model, prompt: "x", max_tokens: 1 << 20 }), 400,
    "prompt");
  const tooLong = await expectStatus(client.completions.create({ model, prompt: "x",
    max_tokens: 1 << 20 }), 400);
  assert.equal(tooLong.code, "context_length_exceeded");
  await expectStatus(client.chat.completions.create({ model,
    messages: [{ role: "user", content: "a".repeat(5 << 20) }] }), 413);
  console.log("openai client test: ok");
} catch (e) {
  failed = true;
  console.error(e);
} finally {
  serve.kill("SIGTERM");
  await new Promise((r) => serve.once("exit", r));
  rmSync(work, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
