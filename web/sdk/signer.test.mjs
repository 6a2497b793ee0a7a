// Tests of the RFC 9421 request signer (node --test): the RFC's own test
// vectors reproduced byte for byte, RFC 9530 digests, the defaults
// Replayguard requires, and verification by an independent implementation
// (the npm package http-message-signatures, a devDependency).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync, createPublicKey, webcrypto } from 'node:crypto';
import {
  signRequest, createSignedFetch, contentDigest, signatureBase, DEFAULT_COMPONENTS, DEFAULT_PARAMS
} from './signer.mjs';

// RFC 9421 Appendix B.1.5 and B.1.4: the test keys.
const TEST_SHARED_SECRET = Buffer.from('uzvJfB4u3N0Jy4T7NZ75MDVcr8zSTInedJtkgcu46YW4XByzNJjxBdtjUkdJPBtbmHhIDi6pcl8jsasjlTMtDQ==', 'base64');
const TEST_KEY_ED25519 = '-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF\n-----END PRIVATE KEY-----\n';
const TEST_KEY_ED25519_PUB = '-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAJrQLj5P/89iXES9+vFgrIy29clF9CC/oPPsw3c5D0bs=\n-----END PUBLIC KEY-----\n';

// RFC 9421 Appendix B.2: the test request.
const testRequest = () => ({
  method: 'POST',
  url: 'http://example.com/foo?param=Value&Pet=dog',
  headers: {
    Host: 'example.com',
    Date: 'Tue, 20 Apr 2021 02:07:55 GMT',
    'Content-Type': 'application/json',
    'Content-Digest': 'sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2UFChF41A2svX+TaPm+AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:',
    'Content-Length': '18'
  },
  body: '{"hello": "world"}'
});

const B25 = {
  options: {
    keyId: 'test-shared-secret', alg: 'hmac-sha256', key: TEST_SHARED_SECRET, label: 'sig-b25',
    components: ['date', '@authority', 'content-type'], params: ['created', 'keyid'], created: 1618884473
  },
  input: 'sig-b25=("date" "@authority" "content-type");created=1618884473;keyid="test-shared-secret"',
  signature: 'sig-b25=:pxcQw6G3AjtMBQjwo8XzkZf/bws5LelbaMk5rGIGtE8=:'
};

const B26 = {
  options: {
    keyId: 'test-key-ed25519', alg: 'ed25519', key: TEST_KEY_ED25519, label: 'sig-b26',
    components: ['date', '@method', '@path', '@authority', 'content-type', 'content-length'], params: ['created', 'keyid'], created: 1618884473
  },
  base: [
    '"date": Tue, 20 Apr 2021 02:07:55 GMT',
    '"@method": POST',
    '"@path": /foo',
    '"@authority": example.com',
    '"content-type": application/json',
    '"content-length": 18',
    '"@signature-params": ("date" "@method" "@path" "@authority" "content-type" "content-length");created=1618884473;keyid="test-key-ed25519"'
  ].join('\n'),
  input: 'sig-b26=("date" "@method" "@path" "@authority" "content-type" "content-length");created=1618884473;keyid="test-key-ed25519"',
  signature: 'sig-b26=:wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw==:'
};

test('RFC 9421 B.2.5: hmac-sha256 over the test request is reproduced exactly', async () => {
  const h = await signRequest(testRequest(), B25.options);
  assert.deepEqual(h, { 'Signature-Input': B25.input, Signature: B25.signature });
});

test('RFC 9421 B.2.6: ed25519 over the test request is reproduced exactly, with the base of the RFC', async () => {
  assert.equal(signatureBase(testRequest(), { components: B26.options.components, params: { created: 1618884473, keyid: 'test-key-ed25519' } }), B26.base);
  const h = await signRequest(testRequest(), B26.options);
  assert.deepEqual(h, { 'Signature-Input': B26.input, Signature: B26.signature });
});

test('the ed25519 key may be a PEM, PKCS #8 DER, the 32-byte seed, Go\'s 64-byte key or a CryptoKey; the request a Request', async () => {
  const der = Buffer.from(TEST_KEY_ED25519.split('\n')[1], 'base64');
  const seed = der.subarray(16);
  const goKey = Buffer.concat([seed, Buffer.from(TEST_KEY_ED25519_PUB.split('\n')[1], 'base64').subarray(12)]);
  const cryptoKey = await webcrypto.subtle.importKey('pkcs8', der, { name: 'Ed25519' }, false, ['sign']);
  const t = testRequest();
  const asRequest = new Request(t.url, { method: t.method, headers: t.headers, body: t.body });
  for (const [name, key, request] of [
    ['DER', der, t], ['seed', seed, t], ['Go key', goKey, t], ['CryptoKey', cryptoKey, t], ['PEM, Request', TEST_KEY_ED25519, asRequest]
  ]) {
    const h = await signRequest(request, { ...B26.options, key });
    assert.equal(h.Signature, B26.signature, name);
  }
  assert.equal(await asRequest.text(), t.body, 'the Request\'s own body is left unread');
});

test('content digests match RFC 9530 and RFC 9421 examples', async () => {
  assert.equal(await contentDigest('{"hello": "world"}'), 'sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:');
  assert.equal(await contentDigest(new TextEncoder().encode('{"hello": "world"}'), 'sha-512'),
    'sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2UFChF41A2svX+TaPm+AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:');
  assert.equal(await contentDigest('{"hello": "world"}\n', 'sha-512'),
    'sha-512=:YMAam51Jz/jOATT6/zvHrLVgOYTGFy1d6GJiOHTohq4yP+pgk4vf2aCsyRZOtw8MjkM7iw7yZ/WkppmM44T3qg==:');
  assert.equal(await contentDigest(null), 'sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:', 'no body digests as empty content');
  await assert.rejects(contentDigest('x', /** @type {any} */ ('md5')), TypeError);
});

test('by default a request with a body covers what Replayguard requires, with a fresh 22-character nonce', async () => {
  const before = Math.floor(Date.now() / 1000);
  const opts = { keyId: 'partner-1', alg: 'hmac-sha256', key: TEST_SHARED_SECRET };
  const req = { method: 'POST', url: 'https://API.example.com:443/v1/orders?id=7', body: '{"hello": "world"}' };
  const a = await signRequest(req, opts);
  const b = await signRequest(req, opts);
  const re = /^sig1=\("@method" "@authority" "@path" "@query" "content-digest"\);created=(\d+);nonce="([A-Za-z0-9_-]{22})";keyid="partner-1";alg="hmac-sha256"$/;
  const [, created, nonce] = re.exec(a['Signature-Input']) || assert.fail(a['Signature-Input']);
  assert.ok(Number(created) >= before && Number(created) <= Math.floor(Date.now() / 1000) + 1);
  assert.notEqual(nonce, re.exec(b['Signature-Input'])?.[2], 'every signature has its own nonce');
  assert.equal(a['Content-Digest'], 'sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:');
  assert.match(a.Signature, /^sig1=:[A-Za-z0-9+/]{43}=:$/);
  assert.deepEqual(DEFAULT_COMPONENTS, ['@method', '@authority', '@path', '@query']);
  assert.deepEqual(DEFAULT_PARAMS, ['created', 'expires', 'nonce', 'keyid', 'alg']);
});

test('a request without a body covers no content-digest; an absent query is "?" and a default port is dropped', async () => {
  const req = { method: 'GET', url: 'https://api.example.com:443/v1/orders' };
  const h = await signRequest(req, { keyId: 'k', alg: 'hmac-sha256', key: TEST_SHARED_SECRET, created: 1700000000, nonce: 'n' });
  assert.equal(h['Content-Digest'], undefined);
  assert.equal(h['Signature-Input'], 'sig1=("@method" "@authority" "@path" "@query");created=1700000000;nonce="n";keyid="k";alg="hmac-sha256"');
  assert.equal(signatureBase(req, { components: DEFAULT_COMPONENTS, params: { created: 1700000000 } }), [
    '"@method": GET', '"@authority": api.example.com', '"@path": /v1/orders', '"@query": ?',
    '"@signature-params": ("@method" "@authority" "@path" "@query");created=1700000000'
  ].join('\n'));
  const empty = await signRequest({ ...req, method: 'POST', body: '' }, { keyId: 'k', alg: 'hmac-sha256', key: TEST_SHARED_SECRET });
  assert.equal(empty['Content-Digest'], undefined, 'an empty body counts as none');
});

test('a content-digest the request came with is replaced by the digest of its body', async () => {
  const t = testRequest();
  const h = await signRequest(t, { keyId: 'k', alg: 'hmac-sha256', key: TEST_SHARED_SECRET, created: 1, nonce: 'n' });
  assert.equal(h['Content-Digest'], 'sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:');
  const base = signatureBase({ ...t, headers: { ...t.headers, 'Content-Digest': h['Content-Digest'] } },
    { components: [...DEFAULT_COMPONENTS, 'content-digest'], params: { created: 1, nonce: 'n', keyid: 'k', alg: 'hmac-sha256' } });
  const key = await webcrypto.subtle.importKey('raw', TEST_SHARED_SECRET, { name: 'HMAC', hash: 'SHA-256' }, false, ['verify']);
  const sig = Buffer.from(h.Signature.slice('sig1=:'.length, -1), 'base64');
  assert.ok(await webcrypto.subtle.verify('HMAC', key, sig, new TextEncoder().encode(base)));
});

test('parameters are serialised as RFC 8941 strings and integers; field values are trimmed and joined; the target is as fetch sends it', async () => {
  const req = { url: 'https://a.example/', headers: { 'X-Multi': ['  one ', 'two\r\n  folded'] } };
  assert.equal(signatureBase(req, { components: ['X-Multi'], params: { keyid: 'a"b\\c', created: 5, expires: -1 } }), [
    '"x-multi": one, two folded',
    '"@signature-params": ("x-multi");keyid="a\\"b\\\\c";created=5;expires=-1'
  ].join('\n'));
  assert.equal(signatureBase({ url: 'https://u:p@API.example.com:443/a/./b/../c|d?q=\'x\'#frag' }, { components: ['@target-uri', '@request-target', '@path', '@query'], params: {} }), [
    '"@target-uri": https://api.example.com/a/c|d?q=%27x%27',
    '"@request-target": /a/c|d?q=%27x%27',
    '"@path": /a/c|d',
    '"@query": ?q=%27x%27',
    '"@signature-params": ("@target-uri" "@request-target" "@path" "@query")'
  ].join('\n'), 'the target as fetch sends it');
  assert.throws(() => signatureBase(req, { components: [], params: { keyid: 'é' } }), TypeError, 'not printable ASCII');
  assert.throws(() => signatureBase(req, { components: [], params: { created: 1.5 } }), TypeError, 'not an integer');
  assert.throws(() => signatureBase(req, { components: [], params: { Keyid: 'x' } }), TypeError, 'not a key');
});

test('bad options and uncoverable components are refused', async () => {
  const ok = { keyId: 'k', alg: 'hmac-sha256', key: TEST_SHARED_SECRET };
  const req = { method: 'GET', url: 'https://a.example/' };
  for (const [name, opts, r] of [
    ['string hmac secret', { ...ok, key: 'c2VjcmV0' }, req],
    ['empty secret', { ...ok, key: new Uint8Array(0) }, req],
    ['unknown alg', { ...ok, alg: 'rsa-pss-sha512' }, req],
    ['no keyId', { ...ok, keyId: '' }, req],
    ['bad label', { ...ok, label: 'Sig 1' }, req],
    ['missing header', { ...ok, components: ['@method', 'authorization'] }, req],
    ['unknown derived component', { ...ok, components: ['@status'] }, req],
    ['component with parameters', { ...ok, components: ['"@query-param";name="id"'] }, req],
    ['duplicate component', { ...ok, components: ['@path', '@PATH'] }, req],
    ['unknown parameter', { ...ok, params: ['tag'] }, req],
    ['nonce over 128 bytes', { ...ok, nonce: 'n'.repeat(129) }, req],
    ['bad key and missing header at once', { ...ok, alg: 'ed25519', key: new Uint8Array(5), components: ['authorization'] }, req],
    ['ed25519 key of the wrong size', { ...ok, alg: 'ed25519', key: new Uint8Array(31) }, req],
    ['ed25519 string that is not a PEM', { ...ok, alg: 'ed25519', key: 'seed' }, req]
  ]) {
    await assert.rejects(signRequest(r, /** @type {any} */ (opts)), name);
  }
  const pub = await webcrypto.subtle.importKey('spki', Buffer.from(TEST_KEY_ED25519_PUB.split('\n')[1], 'base64'), { name: 'Ed25519' }, false, ['verify']);
  await assert.rejects(signRequest(req, { ...ok, alg: 'ed25519', key: pub }), TypeError, 'a public key cannot sign');
  assert.throws(() => createSignedFetch({ ...ok, nonce: 'fixed' }), TypeError, 'a fixed nonce in a fetch wrapper would replay');
});

test('createSignedFetch signs each request, keeps its body, and sends it with the given fetch', async () => {
  /** @type {Request[]} */
  const sent = [];
  const signedFetch = createSignedFetch({
    keyId: 'partner-1', alg: 'hmac-sha256', key: TEST_SHARED_SECRET,
    fetch: async (r) => { sent.push(r); return new Response('ok'); }
  });
  const res = await signedFetch('https://api.example.com/v1/orders?id=7', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"hello": "world"}' });
  assert.equal(await res.text(), 'ok');
  await signedFetch(new Request('https://api.example.com/v1/orders?id=8'));
  assert.equal(sent.length, 2);
  const [post, get] = sent;
  assert.equal(post.method, 'POST');
  assert.equal(await post.text(), '{"hello": "world"}');
  assert.equal(post.headers.get('content-type'), 'application/json');
  assert.equal(post.headers.get('content-digest'), 'sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:');
  assert.match(post.headers.get('signature-input') || '', /^sig1=\("@method" "@authority" "@path" "@query" "content-digest"\);created=\d+;nonce="[\w-]{22}";keyid="partner-1";alg="hmac-sha256"$/);
  assert.equal(get.headers.get('content-digest'), null);
  assert.match(get.headers.get('signature-input') || '', /^sig1=\("@method" "@authority" "@path" "@query"\);/);
  assert.notEqual(nonceOf(post), nonceOf(get));
  await verifiedByIndependentImplementation([post, get], { id: 'partner-1', alg: 'hmac-sha256', key: TEST_SHARED_SECRET });
});

/** @param {Request} r */
function nonceOf(r) {
  return /nonce="([^"]+)"/.exec(r.headers.get('signature-input') || '')?.[1];
}

// ---------------------------------------------------------------- interop

/**
 * http-message-signatures, or null when it is not installed (npm ci was
 * not run); CI=true or REPLAYGUARD_TEST_REQUIRE=1 makes its absence a failure.
 */
async function independent(t) {
  try {
    return await import('http-message-signatures');
  } catch (e) {
    if (process.env.CI === 'true' || process.env.REPLAYGUARD_TEST_REQUIRE === '1') throw e;
    t?.skip('http-message-signatures is not installed: run npm ci in web/sdk');
    return null;
  }
}

/**
 * Verifies Requests with http-message-signatures, requiring created, nonce,
 * keyid and alg; throws unless every one verifies.
 * @param {Request[]} requests
 * @param {{id: string, alg: string, key: any}} key
 */
async function verifiedByIndependentImplementation(requests, key, t) {
  const hms = await independent(t);
  if (!hms) return;
  for (const r of requests) {
    const message = { method: r.method, url: r.url, headers: Object.fromEntries(r.headers) };
    const ok = await hms.httpbis.verifyMessage({
      keyLookup: async ({ keyid }) => (keyid === key.id ? { id: key.id, algs: [key.alg], verify: hms.createVerifier(key.key, key.alg) } : null),
      requiredParams: ['created', 'nonce', 'keyid', 'alg'],
      requiredFields: ['@method', '@authority', '@path', '@query'],
      tolerance: 5
    }, message);
    assert.equal(ok, true, `http-message-signatures refused ${r.method} ${r.url}`);
  }
}

test('our signatures verify with http-message-signatures, hmac-sha256 and ed25519', async (t) => {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  for (const [alg, key, verifyKey] of [
    ['hmac-sha256', TEST_SHARED_SECRET, TEST_SHARED_SECRET],
    ['ed25519', pem, publicKey],
    ['ed25519', B26.options.key, createPublicKey(TEST_KEY_ED25519_PUB)]
  ]) {
    /** @type {Request[]} */
    const sent = [];
    const signedFetch = createSignedFetch({ keyId: 'client', alg, key, fetch: async (r) => { sent.push(r); return new Response(null, { status: 204 }); } });
    await signedFetch('http://127.0.0.1:8080/v1/orders?id=7&q=a%20b', { method: 'PUT', body: 'payload' });
    await signedFetch('https://api.example.com/v1/orders');
    await verifiedByIndependentImplementation(sent, { id: 'client', alg, key: verifyKey }, t);
    if (!sent.length) return;
  }
});

test('http-message-signatures reproduces the B.2.5 and B.2.6 bases we sign', async (t) => {
  const hms = await independent(t);
  if (!hms) return;
  const t0 = testRequest();
  const message = { method: t0.method, url: t0.url, headers: t0.headers };
  for (const v of [B25, B26]) {
    const ours = await signRequest(t0, v.options);
    const ok = await hms.httpbis.verifyMessage({
      keyLookup: async () => ({
        verify: v === B25 ? hms.createVerifier(TEST_SHARED_SECRET, 'hmac-sha256') : hms.createVerifier(createPublicKey(TEST_KEY_ED25519_PUB), 'ed25519')
      }),
      notAfter: 1618884473
    }, { ...message, headers: { ...message.headers, ...ours } });
    assert.equal(ok, true, v.options.label);
  }
});
