// Drives brokerd's HTTP APIs with the official JavaScript clients (npm
// ollama and openai, versions pinned in package.json). Run by
// server/httpapi's Go tests: node clients.mjs BASE_URL API_KEY MODE, where
// MODE "fake" expects the Go tests' fake backend and "daemon" a real brokerd
// serving nbmf-hash-v1 (and, with LLM set, a generator model of that name).
// Prints "ok NAME" per check; exits 1 at the first failure.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { Ollama } from 'ollama';
import OpenAI from 'openai';

const [base, apiKey, mode] = process.argv.slice(2);
const llm = process.env.LLM || (mode === 'fake' ? 'tiny-llm' : '');
const ollama = new Ollama({ host: base, headers: { Authorization: `Bearer ${apiKey}` } });
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });

async function check(name, fn) {
  try {
    await fn();
    console.log(`ok ${name}`);
  } catch (e) {
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  }
}

async function rejects(promise, status) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.status ?? e.status_code, status, `status of ${e}`);
    return e;
  }
  assert.fail(`expected an error with status ${status}`);
}

// Embeddings and listing work against any brokerd (the built-in encoder).
await check('ollama embed', async () => {
  const r = await ollama.embed({ model: 'nbmf-hash-v1', input: ['a memory record', 'another'] });
  assert.equal(r.embeddings.length, 2);
  assert.ok(r.embeddings[0].length > 0);
  if (mode === 'fake') assert.equal(r.embeddings[0][0], 'a memory record'.length);
  if (mode === 'fake') assert.equal(r.prompt_eval_count, 5 + 3); // the fake's [CLS] words [SEP]
});
await check('ollama embeddings (legacy)', async () => {
  const r = await ollama.embeddings({ model: 'nbmf-hash-v1:latest', prompt: 'abcd' });
  assert.ok(r.embedding.length > 0);
  if (mode === 'fake') assert.equal(r.embedding[0], 4);
});
await check('ollama list', async () => {
  const r = await ollama.list();
  assert.ok(r.models.some((m) => m.name === 'nbmf-hash-v1:latest'), JSON.stringify(r.models));
});
await check('ollama ps', async () => {
  const r = await ollama.ps();
  const m = r.models.find((m) => m.name === 'nbmf-hash-v1:latest');
  assert.ok(m, JSON.stringify(r.models));
  // Loaded until unloaded: Ollama's keep_alive -1 expires centuries on.
  assert.ok(Date.parse(m.expires_at) > Date.now() + 100 * 365 * 864e5, m.expires_at);
});
await check('ollama show', async () => {
  const r = await ollama.show({ model: 'nbmf-hash-v1' });
  assert.equal(r.details.family, 'hash-encoder');
});
await check('ollama error: unknown model', async () => {
  await rejects(ollama.embed({ model: 'no-such-model', input: 'x' }), 404);
});
await check('openai embeddings (base64, the client default)', async () => {
  const r = await openai.embeddings.create({ model: 'nbmf-hash-v1', input: 'abc' });
  assert.equal(r.data.length, 1);
  assert.ok(r.data[0].embedding.length > 0);
  if (mode === 'fake') assert.deepEqual(r.data[0].embedding, [3, 1, -1, 0.5]);
  if (mode === 'fake') assert.deepEqual(r.usage, { prompt_tokens: 3, total_tokens: 3 });
});
await check('openai embeddings (float)', async () => {
  const r = await openai.embeddings.create({ model: 'nbmf-hash-v1', input: ['x', 'yy'], encoding_format: 'float' });
  assert.equal(r.data.length, 2);
  assert.equal(r.data[1].index, 1);
});
await check('openai models', async () => {
  const ids = [];
  for await (const m of openai.models.list()) ids.push(m.id);
  assert.ok(ids.includes('nbmf-hash-v1'), ids.join(','));
});
await check('openai error: unknown model', async () => {
  const e = await rejects(openai.embeddings.create({ model: 'no-such-model', input: 'x' }), 404);
  assert.ok(e instanceof OpenAI.NotFoundError);
});
await check('openai error: bad API key', async () => {
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  const e = await rejects(bad.models.list(), 401);
  assert.ok(e instanceof OpenAI.AuthenticationError);
});

if (llm) {
  await check('ollama generate', async () => {
    const r = await ollama.generate({ model: llm, prompt: 'hello', stream: false, options: { num_predict: 8, seed: 7 } });
    assert.equal(r.done, true);
    assert.ok(r.eval_count > 0);
    if (mode === 'fake') assert.equal(r.response, 'chat(user=hello) ünïcode');
  });
  await check('ollama generate streaming', async () => {
    let text = '';
    let last;
    for await (const part of await ollama.generate({ model: llm, prompt: 'hello', stream: true, options: { num_predict: 8 } })) {
      text += part.response;
      last = part;
    }
    assert.equal(last.done, true);
    assert.ok(['stop', 'length'].includes(last.done_reason), last.done_reason);
    if (mode === 'fake') assert.equal(text, 'chat(user=hello) ünïcode');
  });
  await check('ollama chat streaming', async () => {
    let text = '';
    for await (const part of await ollama.chat({ model: llm, stream: true, options: { num_predict: 8 },
      messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }] })) {
      text += part.message.content;
    }
    if (mode === 'fake') assert.equal(text, 'chat(system=be brief|user=hi) ünïcode');
    else assert.ok(text.length >= 0);
  });
  await check('openai chat', async () => {
    const r = await openai.chat.completions.create({ model: llm, max_tokens: 8, seed: 1,
      messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(r.object, 'chat.completion');
    assert.ok(r.usage.completion_tokens > 0);
    if (mode === 'fake') assert.equal(r.choices[0].message.content, 'chat(user=hi) ünïcode');
  });
  await check('openai chat streaming with usage', async () => {
    let text = '';
    let usage;
    const stream = await openai.chat.completions.create({ model: llm, max_tokens: 8, stream: true,
      stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hi' }] });
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) text += c.delta?.content ?? '';
    }
    assert.ok(usage && usage.total_tokens > 0, 'a usage chunk');
    if (mode === 'fake') assert.equal(text, 'chat(user=hi) ünïcode');
  });
  // Logprobs: the chosen token and exactly top_logprobs alternatives per
  // token, one entry per generated token (usage counts them).
  const checkEntry = (e, n) => {
    assert.equal(typeof e.token, 'string');
    assert.ok(Number.isFinite(e.logprob) && e.logprob <= 0, `logprob ${e.logprob}`);
    assert.ok(Array.isArray(e.bytes), 'bytes');
    assert.equal(e.top_logprobs.length, n, `alternatives of ${JSON.stringify(e)}`);
    for (const a of e.top_logprobs) {
      assert.equal(typeof a.token, 'string');
      assert.ok(Number.isFinite(a.logprob) && a.logprob <= 0);
    }
    for (let i = 1; i < e.top_logprobs.length; i++) assert.ok(e.top_logprobs[i - 1].logprob >= e.top_logprobs[i].logprob, 'alternatives in order');
  };
  await check('openai chat logprobs', async () => {
    const r = await openai.chat.completions.create({ model: llm, max_tokens: 6, seed: 1, logprobs: true, top_logprobs: 3,
      messages: [{ role: 'user', content: 'hi' }] });
    const content = r.choices[0].logprobs?.content;
    assert.ok(Array.isArray(content) && content.length > 0, JSON.stringify(r.choices[0]));
    assert.equal(content.length, r.usage.completion_tokens);
    for (const e of content) checkEntry(e, 3);
    if (mode === 'fake') assert.equal(content.map((e) => e.token).join(''), r.choices[0].message.content);
  });
  await check('openai chat logprobs streamed', async () => {
    const stream = await openai.chat.completions.create({ model: llm, max_tokens: 6, stream: true, logprobs: true, top_logprobs: 2,
      stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hi' }] });
    let n = 0;
    let usage;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        for (const e of c.logprobs?.content ?? []) {
          checkEntry(e, 2);
          n++;
        }
      }
    }
    assert.ok(n > 0, 'streamed logprobs');
    assert.equal(n, usage.completion_tokens);
  });
  await check('openai chat without logprobs has null', async () => {
    const r = await openai.chat.completions.create({ model: llm, max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(r.choices[0].logprobs, null);
  });
  await check('openai completions logprobs (legacy shape)', async () => {
    const r = await openai.completions.create({ model: llm, prompt: ['one', 'two'], max_tokens: 5, logprobs: 2 });
    for (const c of r.choices) {
      const lp = c.logprobs;
      assert.ok(lp && lp.tokens.length > 0, JSON.stringify(c));
      assert.equal(lp.token_logprobs.length, lp.tokens.length);
      assert.equal(lp.top_logprobs.length, lp.tokens.length);
      assert.equal(lp.text_offset.length, lp.tokens.length);
      assert.equal(lp.text_offset[0], 0);
      for (const t of lp.top_logprobs) {
        const k = Object.keys(t).length;
        assert.ok(k >= 1 && k <= 2, `alternatives ${JSON.stringify(t)}`);
      }
    }
    assert.equal(r.choices.reduce((s, c) => s + c.logprobs.tokens.length, 0), r.usage.completion_tokens);
  });
  await check('ollama chat logprobs', async () => {
    const r = await ollama.chat({ model: llm, stream: false, logprobs: true, top_logprobs: 4, options: { num_predict: 6 },
      messages: [{ role: 'user', content: 'hi' }] });
    assert.ok(Array.isArray(r.logprobs) && r.logprobs.length > 0, JSON.stringify(r));
    assert.equal(r.logprobs.length, r.eval_count);
    for (const e of r.logprobs) checkEntry(e, 4);
  });
  await check('ollama generate logprobs streamed', async () => {
    let n = 0;
    let last;
    for await (const part of await ollama.generate({ model: llm, prompt: 'hello', stream: true, logprobs: true, top_logprobs: 1, options: { num_predict: 5 } })) {
      for (const e of part.logprobs ?? []) {
        checkEntry(e, 1);
        n++;
      }
      last = part;
    }
    assert.equal(n, last.eval_count);
  });
  await check('openai completions, two prompts', async () => {
    const r = await openai.completions.create({ model: llm, prompt: ['one', 'two'], max_tokens: 5 });
    assert.equal(r.choices.length, 2);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    if (mode === 'fake') assert.deepEqual(r.choices.map((c) => c.text), ['gen: one', 'gen: two']);
  });
  await check('openai chat and completions, return_token_ids (vLLM)', async () => {
    const r = await openai.chat.completions.create({ model: llm, max_tokens: 6, return_token_ids: true,
      messages: [{ role: 'user', content: 'hi' }] });
    assert.ok(Array.isArray(r.prompt_token_ids) && r.prompt_token_ids.length > 0, JSON.stringify(r));
    assert.ok(Array.isArray(r.choices[0].token_ids) && r.choices[0].token_ids.length > 0, JSON.stringify(r));
    const c = await openai.completions.create({ model: llm, max_tokens: 6, return_token_ids: true, prompt: [11, 12, 13] });
    if (mode === 'daemon') {
      // The ids are what the model ran and wrote, as usage counts them.
      assert.equal(r.prompt_token_ids.length, r.usage.prompt_tokens);
      assert.equal(r.choices[0].token_ids.length, r.usage.completion_tokens);
      assert.deepEqual(c.choices[0].prompt_token_ids, [11, 12, 13]);
      assert.equal(c.choices[0].token_ids.length, c.usage.completion_tokens);
    }
  });
  await check('openai completions, token-id prompts', async () => {
    const r = await openai.completions.create({ model: llm, prompt: [[11, 12, 13], [14]], max_tokens: 3 });
    assert.equal(r.choices.length, 2);
    assert.equal(r.usage.prompt_tokens, 4);
    if (mode === 'fake') assert.deepEqual(r.choices.map((c) => c.text), ['gen: ids 11,12,13', 'gen: ids 14']);
    const one = await openai.completions.create({ model: llm, prompt: [11, 12], max_tokens: 3 });
    assert.equal(one.choices.length, 1);
    assert.equal(one.usage.prompt_tokens, 2);
    await rejects(openai.completions.create({ model: llm, prompt: [11, 12], echo: true, max_tokens: 3 }), 400);
  });
  // The Responses API: created, read back, listed, continued and deleted
  // with the official client; streamed through its strict accumulator.
  const outputText = (r) => r.output.filter((o) => o.type === 'message').flatMap((o) => o.content).map((c) => c.text).join('');
  await check('openai responses: create, retrieve, input items, continue, delete', async () => {
    const r = await openai.responses.create({ model: llm, input: 'hi', instructions: 'be brief', max_output_tokens: 16 });
    assert.equal(r.object, 'response');
    assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
    assert.ok(r.usage.output_tokens > 0 && r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens, JSON.stringify(r.usage));
    assert.equal(r.output_text, outputText(r));
    if (mode === 'fake') assert.equal(r.output_text, 'chat(system=be brief|user=hi) ünïcode');
    const again = await openai.responses.retrieve(r.id);
    assert.equal(again.id, r.id);
    assert.equal(outputText(again), r.output_text);
    const items = [];
    for await (const it of openai.responses.inputItems.list(r.id)) items.push(it);
    assert.equal(items.length, 1);
    assert.equal(items[0].content[0].text, 'hi');
    const next = await openai.responses.create({ model: llm, previous_response_id: r.id, input: 'more', max_output_tokens: 16 });
    assert.equal(next.previous_response_id, r.id);
    if (mode === 'fake') assert.equal(next.output_text, `chat(user=hi|assistant=${r.output_text}|user=more) ünïcode`);
    if (mode === 'daemon') assert.ok(next.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens, 'the continuation carries the conversation');
    await openai.responses.delete(r.id);
    await rejects(openai.responses.retrieve(r.id), 404);
    await rejects(openai.responses.create({ model: llm, previous_response_id: r.id, input: 'x' }), 404);
  });
  await check('openai responses streamed', async () => {
    let text = '';
    const stream = openai.responses.stream({ model: llm, input: 'hi', max_output_tokens: 16, store: false });
    stream.on('response.output_text.delta', (e) => { text += e.delta; });
    const final = await stream.finalResponse();
    assert.equal(final.output_text, text);
    assert.equal(final.store, false);
    if (mode === 'fake') assert.equal(text, 'chat(user=hi) ünïcode');
  });
  await check('openai responses logprobs', async () => {
    const r = await openai.responses.create({ model: llm, input: 'hi', max_output_tokens: 6, store: false,
      include: ['message.output_text.logprobs'], top_logprobs: 2 });
    const lps = r.output.filter((o) => o.type === 'message').flatMap((o) => o.content).flatMap((c) => c.logprobs);
    assert.ok(lps.length > 0 && lps.length <= r.usage.output_tokens, `${lps.length} logprobs, ${r.usage.output_tokens} tokens`);
    for (const e of lps) checkEntry(e, 2);
  });
  await check('openai usage: the prefix cache\'s tokens', async () => {
    // The same long prompt twice: the second finds the first's blocks.
    const messages = [{ role: 'user', content: 'The council reviews the memory record. '.repeat(20) }];
    const a = await openai.chat.completions.create({ model: llm, max_tokens: 2, messages });
    const b = await openai.chat.completions.create({ model: llm, max_tokens: 2, messages });
    const r = await openai.responses.create({ model: llm, max_output_tokens: 2, input: messages, store: false });
    for (const u of [a.usage, b.usage]) assert.ok(u.prompt_tokens_details.cached_tokens <= u.prompt_tokens, JSON.stringify(u));
    assert.ok(r.usage.input_tokens_details.cached_tokens <= r.usage.input_tokens, JSON.stringify(r.usage));
    if (mode === 'daemon') {
      assert.ok(b.usage.prompt_tokens_details.cached_tokens >= b.usage.prompt_tokens / 2, JSON.stringify(b.usage));
      assert.ok(r.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens / 2, JSON.stringify(r.usage));
    }
  });
  await check('token counts: the Responses API\'s input tokens, vLLM\'s /tokenize and /detokenize', async () => {
    const body = { model: llm, input: 'hi', instructions: 'be brief' };
    const n = await openai.responses.inputTokens.count(body);
    assert.equal(n.object, 'response.input_tokens');
    const r = await openai.responses.create({ ...body, max_output_tokens: 2, store: false });
    assert.equal(n.input_tokens, r.usage.input_tokens);
    const vllm = async (path, b) => {
      const res = await fetch(`${base}${path}`, { method: 'POST', body: JSON.stringify(b),
        headers: { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' } });
      assert.equal(res.status, 200, path);
      return res.json();
    };
    const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }];
    const t = await vllm('/tokenize', { model: llm, messages });
    const c = await openai.chat.completions.create({ model: llm, messages, max_tokens: 2 });
    assert.equal(t.count, c.usage.prompt_tokens);
    assert.equal(t.tokens.length, t.count);
    assert.ok(t.max_model_len > t.count);
    if (mode === 'daemon') {
      const d = await vllm('/detokenize', { model: llm, tokens: t.tokens });
      assert.ok(d.prompt.includes('be brief') && d.prompt.includes('hi'), d.prompt);
    }
  });
  await check('openai chat, n choices', async () => {
    const r = await openai.chat.completions.create({ model: llm, messages: [{ role: 'user', content: 'Verdict?' }], n: 3, seed: 5, max_tokens: 5 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    for (const c of r.choices) assert.equal(typeof c.message.content, 'string');
    let streamed = [0, 0, 0];
    const s = await openai.chat.completions.create({ model: llm, messages: [{ role: 'user', content: 'Verdict?' }], n: 3, seed: 5, max_tokens: 5, stream: true });
    for await (const c of s) for (const ch of c.choices) if (ch.finish_reason) streamed[ch.index]++;
    assert.deepEqual(streamed, [1, 1, 1]);
  });
}

// Thinking: THINK_LLM is a thinking model (Qwen3's template) that thinks
// THINK_REASONING and answers THINK_CONTENT; the fake's tiny-llm thinks
// "hmm, let me think" when asked to.
const thinker = process.env.THINK_LLM || (mode === 'fake' ? 'tiny-llm' : '');
if (thinker) {
  const reasoning = process.env.THINK_REASONING || 'hmm, let me think';
  const content = process.env.THINK_CONTENT;
  const msgs = [{ role: 'user', content: 'Red or blue?' }];
  const noTags = (s) => assert.ok(!/<\/?think>/.test(s ?? ''), `a tag leaked: ${s}`);
  await check('ollama chat think', async () => {
    const r = await ollama.chat({ model: thinker, messages: msgs, think: true, stream: false, options: { temperature: 0 } });
    assert.equal(r.message.thinking, reasoning);
    noTags(r.message.content);
    if (content) assert.equal(r.message.content, content);
  });
  await check('ollama chat think streamed', async () => {
    let thinking = '';
    let text = '';
    for await (const part of await ollama.chat({ model: thinker, messages: msgs, think: true, stream: true, options: { temperature: 0 } })) {
      thinking += part.message.thinking ?? '';
      text += part.message.content;
    }
    assert.equal(thinking, reasoning);
    noTags(text);
    if (content) assert.equal(text, content);
  });
  await check('ollama generate think', async () => {
    const r = await ollama.generate({ model: thinker, prompt: 'Red or blue?', think: true, stream: false, options: { temperature: 0 } });
    assert.equal(r.thinking, reasoning);
    noTags(r.response);
    if (content) assert.equal(r.response, content);
  });
  await check('ollama chat think false', async () => {
    const r = await ollama.chat({ model: thinker, messages: msgs, think: false, stream: false, options: { temperature: 0 } });
    assert.ok(!r.message.thinking, `thinking ${r.message.thinking}`);
    noTags(r.message.content);
    if (content) assert.equal(r.message.content, content);
  });
  await check('openai chat reasoning_content', async () => {
    const r = await openai.chat.completions.create({ model: thinker, messages: msgs, temperature: 0,
      chat_template_kwargs: { enable_thinking: true } });
    assert.equal(r.choices[0].message.reasoning_content, reasoning);
    noTags(r.choices[0].message.content);
    if (content) assert.equal(r.choices[0].message.content, content);
  });
  await check('openai chat reasoning_content streamed', async () => {
    let thinking = '';
    let text = '';
    const stream = await openai.chat.completions.create({ model: thinker, messages: msgs, temperature: 0, stream: true,
      chat_template_kwargs: { enable_thinking: true } });
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        thinking += c.delta?.reasoning_content ?? '';
        text += c.delta?.content ?? '';
      }
    }
    assert.equal(thinking, reasoning);
    noTags(text);
    if (content) assert.equal(text, content);
  });
  await check('openai responses reasoning', async () => {
    const r = await openai.responses.create({ model: thinker, input: msgs, temperature: 0, reasoning: { effort: 'medium' }, store: false });
    assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
    assert.equal(r.output[0].content[0].text, reasoning);
    noTags(r.output_text);
    if (content) assert.equal(r.output_text, content);
    if (mode === 'daemon') {
      const n = r.usage.output_tokens_details.reasoning_tokens;
      assert.ok(n > 0 && n < r.usage.output_tokens, JSON.stringify(r.usage));
    }
  });
  await check('openai responses reasoning streamed', async () => {
    let thinking = '';
    const stream = openai.responses.stream({ model: thinker, input: msgs, temperature: 0, reasoning: { effort: 'high' }, store: false });
    stream.on('response.reasoning_text.delta', (e) => { thinking += e.delta; });
    const final = await stream.finalResponse();
    assert.equal(thinking, reasoning);
    noTags(final.output_text);
    if (content) assert.equal(final.output_text, content);
  });
  await check('openai responses reasoning none', async () => {
    const r = await openai.responses.create({ model: thinker, input: msgs, temperature: 0, reasoning: { effort: 'none' }, store: false });
    assert.deepEqual(r.output.map((o) => o.type), ['message']);
    if (content) assert.equal(r.output_text, content);
  });
  await check('openai chat reasoning_effort', async () => {
    const on = await openai.chat.completions.create({ model: thinker, messages: msgs, temperature: 0, reasoning_effort: 'low' });
    assert.equal(on.choices[0].message.reasoning_content, reasoning);
    const off = await openai.chat.completions.create({ model: thinker, messages: msgs, temperature: 0, reasoning_effort: 'none' });
    assert.equal(off.choices[0].message.reasoning_content ?? null, null);
    if (content) assert.equal(off.choices[0].message.content, content);
  });
  await check('openai chat with thinking off', async () => {
    const r = await openai.chat.completions.create({ model: thinker, messages: msgs, temperature: 0,
      chat_template_kwargs: { enable_thinking: false } });
    assert.equal(r.choices[0].message.reasoning_content ?? null, null);
    noTags(r.choices[0].message.content);
    if (content) assert.equal(r.choices[0].message.content, content);
  });
}

// Tools: TOOL_LLM (Qwen3's template) answers TOOL_CONTENT and then calls
// get_weather, whose parameters are TOOL_SCHEMA; TOOL_TEXT is the call as
// the model writes it. A round trip feeds the call and TOOL_RESULT back:
// the prompt is TOOL_ROUNDTRIP_PROMPT_TOKENS tokens as Qwen3's template
// renders it.
const toolLLM = process.env.TOOL_LLM;
if (toolLLM) {
  const schema = JSON.parse(process.env.TOOL_SCHEMA);
  const content = process.env.TOOL_CONTENT;
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Get the weather in a city.', parameters: schema } }];
  const rtools = [{ type: 'function', name: 'get_weather', description: 'Get the weather in a city.', parameters: schema }];
  const msgs = [{ role: 'user', content: process.env.TOOL_QUERY }];
  const roundTripTokens = Number(process.env.TOOL_ROUNDTRIP_PROMPT_TOKENS);
  // The arguments against the tool's schema: an object with its required
  // properties, each of its type, and no other.
  const checkArgs = (args) => {
    assert.equal(typeof args, 'object');
    for (const k of schema.required) assert.ok(k in args, `missing ${k} in ${JSON.stringify(args)}`);
    for (const [k, v] of Object.entries(args)) {
      assert.ok(k in schema.properties, `unknown argument ${k}`);
      assert.equal(typeof v, schema.properties[k].type);
    }
    assert.equal(args.city, 'Paris');
  };
  const checkOpenAICall = (tc) => {
    assert.match(tc.id, /^call_[A-Za-z0-9]{24}$/);
    assert.equal(tc.type, 'function');
    assert.equal(tc.function.name, 'get_weather');
    checkArgs(JSON.parse(tc.function.arguments));
  };
  let openaiAnswer;
  await check('openai chat tools', async () => {
    const r = await openai.chat.completions.create({ model: toolLLM, messages: msgs, tools, temperature: 0 });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.content, content);
    assert.equal(c.message.tool_calls.length, 1);
    checkOpenAICall(c.message.tool_calls[0]);
    openaiAnswer = c.message;
  });
  await check('openai chat tools streamed', async () => {
    const calls = [];
    let text = '';
    let finish;
    const stream = await openai.chat.completions.create({ model: toolLLM, messages: msgs, tools, tool_choice: 'auto', temperature: 0, stream: true });
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        text += c.delta?.content ?? '';
        for (const tc of c.delta?.tool_calls ?? []) {
          // OpenAI's streaming: pieces of a call share its index.
          const cur = calls[tc.index] ?? (calls[tc.index] = { id: '', type: '', function: { name: '', arguments: '' } });
          cur.id += tc.id ?? '';
          cur.type += tc.type ?? '';
          cur.function.name += tc.function?.name ?? '';
          cur.function.arguments += tc.function?.arguments ?? '';
        }
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(text, content);
    assert.equal(finish, 'tool_calls');
    assert.equal(calls.length, 1);
    checkOpenAICall(calls[0]);
  });
  await check('openai chat tool result round trip', async () => {
    const call = openaiAnswer.tool_calls[0];
    const r = await openai.chat.completions.create({ model: toolLLM, tools, temperature: 0, messages: [...msgs, openaiAnswer,
      { role: 'tool', tool_call_id: call.id, content: process.env.TOOL_RESULT }] });
    assert.equal(r.usage.prompt_tokens, roundTripTokens);
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
  });
  await check('vLLM /tokenize of a chat with tools counts what the chat runs', async () => {
    const res = await fetch(`${base}/tokenize`, { method: 'POST', body: JSON.stringify({ model: toolLLM, messages: msgs, tools }),
      headers: { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' } });
    const t = await res.json();
    const r = await openai.chat.completions.create({ model: toolLLM, messages: msgs, tools, temperature: 0, max_tokens: 1 });
    assert.equal(t.count, r.usage.prompt_tokens);
    const n = await openai.responses.inputTokens.count({ model: toolLLM, input: msgs, tools: rtools });
    assert.equal(n.input_tokens, r.usage.prompt_tokens);
  });
  await check('openai chat tool_choice none', async () => {
    const r = await openai.chat.completions.create({ model: toolLLM, messages: msgs, tools, tool_choice: 'none', temperature: 0 });
    assert.equal(r.choices[0].message.content, content + process.env.TOOL_TEXT);
    assert.ok(!r.choices[0].message.tool_calls, JSON.stringify(r.choices[0].message));
    assert.equal(r.choices[0].finish_reason, 'stop');
  });
  await check('openai chat tool_choice required', async () => {
    // Constrained to the tools' schemas: the answer is a call.
    const r = await openai.chat.completions.create({ model: toolLLM, messages: msgs, tools, tool_choice: 'required', temperature: 0 });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.content, null);
    assert.equal(c.message.tool_calls.length, 1);
    checkOpenAICall(c.message.tool_calls[0]);
  });
  await check('openai chat tool_choice a named function, streamed', async () => {
    const calls = [];
    let finish;
    const stream = await openai.chat.completions.create({ model: toolLLM, messages: msgs, tools, temperature: 0, stream: true,
      tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        assert.ok(!c.delta?.content, `content ${c.delta?.content}`);
        calls.push(...(c.delta?.tool_calls ?? []));
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(finish, 'stop'); // as vLLM and OpenAI answer a named function
    assert.equal(calls.length, 1);
    checkOpenAICall(calls[0]);
  });
  await check('openai chat tool_choice a function that is not a tool', async () => {
    await rejects(openai.chat.completions.create({ model: toolLLM, messages: msgs, tools,
      tool_choice: { type: 'function', function: { name: 'get_time' } } }), 400);
  });
  // The Responses API's flat function tools; the call's output goes back
  // as an item, or after previous_response_id: the prompt is the chat's.
  await check('openai responses tools, round trip', async () => {
    const r = await openai.responses.create({ model: toolLLM, input: msgs, tools: rtools, temperature: 0 });
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(r.output));
    assert.equal(calls[0].name, 'get_weather');
    assert.match(calls[0].call_id, /^call_[A-Za-z0-9]{24}$/);
    checkArgs(JSON.parse(calls[0].arguments));
    assert.equal(r.output_text, content);
    const result = { type: 'function_call_output', call_id: calls[0].call_id, output: process.env.TOOL_RESULT };
    const back = await openai.responses.create({ model: toolLLM, tools: rtools, temperature: 0, store: false, input: [...msgs, ...r.output, result] });
    assert.equal(back.usage.input_tokens, roundTripTokens);
    const cont = await openai.responses.create({ model: toolLLM, tools: rtools, temperature: 0, store: false, previous_response_id: r.id, input: [result] });
    assert.equal(cont.usage.input_tokens, roundTripTokens);
  });
  await check('openai responses tools streamed', async () => {
    let args = '';
    const stream = openai.responses.stream({ model: toolLLM, input: msgs, tools: rtools, temperature: 0, store: false });
    stream.on('response.function_call_arguments.delta', (e) => { args += e.delta; });
    const final = await stream.finalResponse();
    const calls = final.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].arguments, args);
    checkArgs(JSON.parse(args));
  });
  await check('openai responses tool_choice required', async () => {
    const r = await openai.responses.create({ model: toolLLM, input: msgs, tools: rtools, tool_choice: 'required', temperature: 0, store: false });
    assert.deepEqual(r.output.filter((o) => o.type !== 'reasoning').map((o) => o.type), ['function_call']);
    checkArgs(JSON.parse(r.output.find((o) => o.type === 'function_call').arguments));
  });
  let ollamaAnswer;
  await check('ollama chat tools', async () => {
    const r = await ollama.chat({ model: toolLLM, messages: msgs, tools, stream: false, options: { temperature: 0 } });
    assert.equal(r.message.content, content);
    assert.equal(r.message.tool_calls.length, 1);
    assert.equal(r.message.tool_calls[0].function.name, 'get_weather');
    checkArgs(r.message.tool_calls[0].function.arguments);
    assert.equal(r.done_reason, 'stop');
    ollamaAnswer = r.message;
  });
  await check('ollama chat tools streamed', async () => {
    const calls = [];
    let text = '';
    for await (const part of await ollama.chat({ model: toolLLM, messages: msgs, tools, stream: true, options: { temperature: 0 } })) {
      text += part.message.content;
      calls.push(...(part.message.tool_calls ?? []));
    }
    assert.equal(text, content);
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, 'get_weather');
    checkArgs(calls[0].function.arguments);
  });
  await check('ollama chat tool result round trip', async () => {
    const r = await ollama.chat({ model: toolLLM, tools, stream: false, options: { temperature: 0 },
      messages: [...msgs, ollamaAnswer, { role: 'tool', content: process.env.TOOL_RESULT }] });
    assert.equal(r.prompt_eval_count, roundTripTokens);
    assert.equal(r.message.tool_calls.length, 1);
  });
}

if (mode === 'fake') {
  await check('openai error: queue full is 429 with Retry-After', async () => {
    const e = await rejects(openai.chat.completions.create({ model: 'busy', messages: [{ role: 'user', content: 'x' }] }), 429);
    assert.ok(e instanceof OpenAI.RateLimitError);
    assert.equal(e.headers.get('retry-after'), '2');
  });
  await check('openai error: draining is 503', async () => {
    await rejects(openai.chat.completions.create({ model: 'draining', messages: [{ role: 'user', content: 'x' }] }), 503);
  });
  await check('ollama error: format yaml is refused', async () => {
    await rejects(ollama.generate({ model: 'tiny-llm', prompt: 'x', format: 'yaml' }), 400);
  });
  await check('openai error: an unknown response_format is refused', async () => {
    await rejects(openai.chat.completions.create({ model: 'tiny-llm', messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'xml' } }), 400);
  });
}

// Structured output against a real brokerd (STRUCT_LLM, a random-weight
// model at temperature 1): the answers under STRUCT_SCHEMA parse as JSON
// and are written to STRUCT_OUT for the Go test to validate against it.
// Thinking is off (a thinking model not told may think first, and a random
// one may not close its block within max_tokens): the JSON alone.
const structLLM = process.env.STRUCT_LLM;
if (structLLM) {
  const schema = JSON.parse(process.env.STRUCT_SCHEMA);
  const outs = [];
  const messages = [{ role: 'user', content: 'Describe a person as JSON.' }];
  await check('openai response_format json_schema', async () => {
    const r = await openai.chat.completions.create({ model: structLLM, messages, temperature: 1, seed: 1, max_tokens: 200,
      chat_template_kwargs: { enable_thinking: false },
      response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } } });
    assert.equal(r.choices[0].finish_reason, 'stop');
    outs.push(JSON.parse(r.choices[0].message.content));
  });
  await check('openai response_format json_schema streamed', async () => {
    const s = await openai.chat.completions.create({ model: structLLM, messages, temperature: 1, seed: 2, max_tokens: 200, stream: true,
      chat_template_kwargs: { enable_thinking: false },
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema } } });
    let text = '';
    let finish;
    for await (const c of s) {
      text += c.choices[0]?.delta?.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'stop');
    outs.push(JSON.parse(text));
  });
  await check('openai completions response_format json_schema', async () => {
    const r = await openai.completions.create({ model: structLLM, prompt: 'A person as JSON: ', temperature: 1, seed: 3, max_tokens: 200,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema } } });
    assert.equal(r.choices[0].finish_reason, 'stop');
    outs.push(JSON.parse(r.choices[0].text));
  });
  await check('openai responses text.format json_schema', async () => {
    const r = await openai.responses.create({ model: structLLM, input: messages, temperature: 1, seed: 6, max_output_tokens: 200, store: false,
      reasoning: { effort: 'none' }, text: { format: { type: 'json_schema', name: 'person', strict: true, schema } } });
    assert.equal(r.status, 'completed');
    outs.push(JSON.parse(r.output_text));
  });
  await check('ollama chat format schema', async () => {
    const r = await ollama.chat({ model: structLLM, messages, format: schema, think: false, stream: false, options: { temperature: 1, seed: 4, num_predict: 200 } });
    assert.equal(r.done_reason, 'stop');
    outs.push(JSON.parse(r.message.content));
  });
  await check('ollama generate format schema, streamed', async () => {
    const s = await ollama.generate({ model: structLLM, prompt: 'A person as JSON.', format: schema, think: false, stream: true, options: { temperature: 1, seed: 5, num_predict: 200 } });
    let text = '';
    let reason;
    for await (const c of s) {
      text += c.response;
      reason = c.done_reason ?? reason;
    }
    assert.equal(reason, 'stop');
    outs.push(JSON.parse(text));
  });
  await check('ollama error: an unsupported schema is 400', async () => {
    await rejects(ollama.chat({ model: structLLM, messages, format: { type: 'object', not: {} }, stream: false }), 400);
  });
  writeFileSync(process.env.STRUCT_OUT, JSON.stringify(outs));
}
console.log('all ok');
