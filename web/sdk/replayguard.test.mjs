// Unit tests for the SDK's pure helpers and its fetch logic, with Node's
// built-in test runner (node --test). The DOM behaviour is tested in a
// real browser by test/browser.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import ReplayGuard, { ReplayGuard as named } from './replayguard.mjs';

const { backoff, failure, expiry, unloads } = ReplayGuard._;

test('the module entry exports the object the classic script defines', () => {
  assert.equal(ReplayGuard, globalThis.ReplayGuard);
  assert.equal(named, ReplayGuard);
});

test('backoff doubles from 250 ms, caps at 2 s and adds under 100 ms of jitter', () => {
  assert.deepEqual([1, 2, 3, 4, 5, 9].map((n) => backoff(n, 0)), [250, 500, 1000, 2000, 2000, 2000]);
  assert.equal(backoff(1, 0.999), 349);
});

test('failure reasons follow the status', () => {
  assert.deepEqual(failure(0), { reason: 'network', status: 0 });
  assert.deepEqual(failure(429), { reason: 'rate_limited', status: 429 });
  assert.deepEqual(failure(503), { reason: 'server', status: 503 });
  assert.deepEqual(failure(400), { reason: 'server', status: 400 });
});

test('expiry reads exp from a JWT, base64url included, and 0 from garbage', () => {
  const payload = Buffer.from(JSON.stringify({ exp: 1800000000, sub: '??>' })).toString('base64url');
  assert.match(payload, /[-_]/, 'the fixture must exercise base64url characters');
  assert.equal(expiry(`h.${payload}.s`), 1800000000 * 1000);
  for (const bad of ['', 'a.b.c', 'no-dots', 'h.' + Buffer.from('{"exp":"x"}').toString('base64url') + '.s']) {
    assert.equal(expiry(bad), 0, bad);
  }
});

test('unloads tells a submission that replaces this page from one that goes to another window or frame', () => {
  const cases = [
    // [target, this window's name, replaces this page]
    [null, '', true, 'no target attribute'],
    ['', '', true, 'an empty target'],
    ['_self', '', true, '_self'],
    ['_SELF', '', true, 'keywords are case-insensitive'],
    ['_parent', '', true, '_parent navigates a frame around this one, or this window'],
    ['_top', 'inner', true, '_top navigates the whole tab'],
    ['checkout', 'checkout', true, "this window's own name"],
    ['_blank', '', false, '_blank opens a new tab'],
    ['_Blank', '', false, '_blank in any case'],
    ['invoice', '', false, 'a named window or iframe'],
    ['Checkout', 'checkout', false, 'names are case-sensitive'],
    ['_new', '', false, 'an unknown keyword is a name: a new window'],
  ];
  for (const [target, own, want, why] of cases) {
    assert.equal(unloads(target, own), want, why);
  }
});

test('configure merges and returns the configuration in force', () => {
  const before = { ...ReplayGuard.configure() };
  assert.deepEqual(before, { endpoint: '/v1/tokens', field: 'idempotency_token', header: 'Idempotency-Token', credentials: 'same-origin', retries: 3, guard: 1000 });
  assert.equal(ReplayGuard.configure({ endpoint: 'https://rg.example/v1/tokens' }).endpoint, 'https://rg.example/v1/tokens');
  ReplayGuard.configure(before);
});

/** Replaces globalThis.fetch for one test with a scripted fake. */
function fakeFetch(t, answers) {
  const calls = [];
  const real = globalThis.fetch;
  globalThis.fetch = async (input, init) => {
    const req = new Request(input, init);
    calls.push({ url: req.url, method: req.method, headers: Object.fromEntries(req.headers), body: await req.text() });
    const next = answers.shift();
    if (next instanceof Error) throw next;
    return next;
  };
  t.after(() => { globalThis.fetch = real; });
  return calls;
}

const json = (status, body) => new Response(JSON.stringify(body), { status, headers: { 'Content-Type': 'application/json' } });

test('token posts the purpose as JSON and maps failures', async (t) => {
  ReplayGuard.configure({ endpoint: 'http://rg.test/v1/tokens' });
  t.after(() => ReplayGuard.configure({ endpoint: '/v1/tokens' }));
  const calls = fakeFetch(t, [json(201, { token: 'T1' }), json(429, {}), json(503, {}), new TypeError('offline')]);
  assert.equal(await ReplayGuard.token('checkout'), 'T1');
  assert.equal(calls[0].method, 'POST');
  assert.equal(calls[0].headers['content-type'], 'application/json');
  assert.deepEqual(JSON.parse(calls[0].body), { purpose: 'checkout' });
  await assert.rejects(ReplayGuard.token(), { reason: 'rate_limited', status: 429 });
  await assert.rejects(ReplayGuard.token(), { reason: 'server', status: 503 });
  await assert.rejects(ReplayGuard.token(), { reason: 'network', status: 0 });
});

test('fetch retries a network failure with the same token and body', async (t) => {
  ReplayGuard.configure({ retries: 2 });
  t.after(() => ReplayGuard.configure({ retries: 3 }));
  const calls = fakeFetch(t, [new TypeError('reset'), new TypeError('reset'), new Response('ok', { status: 201 })]);
  const res = await ReplayGuard.fetch('http://app.test/orders', { method: 'POST', body: 'qty=1' }, { token: 'T9' });
  assert.equal(res.status, 201);
  assert.equal(calls.length, 3);
  for (const c of calls) {
    assert.equal(c.headers['idempotency-token'], 'T9');
    assert.equal(c.body, 'qty=1');
  }
});

test('fetch gives up after the configured retries and never retries a response', async (t) => {
  ReplayGuard.configure({ retries: 1 });
  t.after(() => ReplayGuard.configure({ retries: 3 }));
  let calls = fakeFetch(t, [new TypeError('a'), new TypeError('b')]);
  await assert.rejects(ReplayGuard.fetch('http://app.test/x', { method: 'POST' }, { token: 'T' }), /b/);
  assert.equal(calls.length, 2);
  calls = fakeFetch(t, [new Response('boom', { status: 502 })]);
  assert.equal((await ReplayGuard.fetch('http://app.test/x', { method: 'POST' }, { token: 'T' })).status, 502);
  assert.equal(calls.length, 1);
});

test('fetch does not retry an aborted request', async (t) => {
  const ctl = new AbortController();
  const calls = fakeFetch(t, [Object.assign(new Error('aborted'), { name: 'AbortError' })]);
  ctl.abort();
  await assert.rejects(ReplayGuard.fetch('http://app.test/x', { method: 'POST', signal: ctl.signal }, { token: 'T' }));
  assert.ok(calls.length <= 1);
});

test('fetch without a token asks the endpoint for one first', async (t) => {
  ReplayGuard.configure({ endpoint: 'http://rg.test/v1/tokens' });
  t.after(() => ReplayGuard.configure({ endpoint: '/v1/tokens' }));
  const calls = fakeFetch(t, [json(201, { token: 'FRESH' }), new Response(null, { status: 204 })]);
  await ReplayGuard.fetch('http://app.test/pay', { method: 'POST' }, { purpose: 'pay' });
  assert.deepEqual(JSON.parse(calls[0].body), { purpose: 'pay' });
  assert.equal(calls[1].headers['idempotency-token'], 'FRESH');
});
