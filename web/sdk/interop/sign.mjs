// Signs one request for the Go interoperability test (replay/interop_test.go)
// and prints it as JSON. Reads from stdin:
//   {"impl": "http-message-signatures" | "replayguard", "alg": "hmac-sha256" | "ed25519",
//    "keyid": "...", "secret": "<base64>" (hmac-sha256), "method": "POST", "url": "https://...",
//    "headers": {"name": "value"}, "body": "<base64>" | null, "created": <unix seconds>,
//    "nonce": "...", "expires": <unix seconds>?, "digest": "sha-256" | "sha-512",
//    "private_key": "<PKCS #8 PEM>"? (ed25519; default: a key pair generated here),
//    "send": true? (send the signed request with fetch, to a loopback test server)}
// and prints {"method", "url" (as sent on the wire), "headers", "public_key" (ed25519:
// SPKI PEM), "status" and "response" (with "send": the answer's status and body)}.
// "http-message-signatures" is the independent implementation (npm, a
// devDependency); "replayguard" is our signer.mjs. Ed25519 key pairs are
// generated here, so the Go side also parses a PEM made by another encoder.
import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync } from 'node:crypto';
import { signRequest } from '../signer.mjs';

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const req = JSON.parse(Buffer.concat(chunks).toString('utf8'));

const url = new URL(req.url).href;
const body = req.body == null ? null : Buffer.from(req.body, 'base64');
const headers = { ...(req.headers || {}) };
let key;
let publicKey;
if (req.alg === 'hmac-sha256') {
  key = Buffer.from(req.secret, 'base64');
} else {
  key = req.private_key ? createPrivateKey(req.private_key) : generateKeyPairSync('ed25519').privateKey;
  publicKey = createPublicKey(key).export({ type: 'spki', format: 'pem' }).toString();
}

let signed;
if (req.impl === 'replayguard') {
  const out = await signRequest({ method: req.method, url, headers, body }, {
    keyId: req.keyid, alg: req.alg, created: req.created, nonce: req.nonce, expires: req.expires,
    key: req.alg === 'ed25519' ? key.export({ type: 'pkcs8', format: 'pem' }).toString() : key
  });
  signed = { ...headers, ...out };
} else {
  const { httpbis, createSigner } = await import('http-message-signatures');
  const fields = ['@method', '@authority', '@path', '@query'];
  if (body && body.length) {
    const alg = req.digest || 'sha-256';
    headers['Content-Digest'] = `${alg}=:${createHash(alg.replace('-', '')).update(body).digest('base64')}:`;
    fields.push('content-digest');
  }
  if (headers['Content-Type']) fields.push('content-type');
  const params = ['created', ...(req.expires ? ['expires'] : []), 'nonce', 'keyid', 'alg'];
  const message = await httpbis.signMessage({
    key: createSigner(key, req.alg, req.keyid),
    name: 'sig1',
    fields,
    params,
    paramValues: {
      created: new Date(req.created * 1000),
      ...(req.expires ? { expires: new Date(req.expires * 1000) } : {}),
      nonce: req.nonce,
      keyid: req.keyid,
      alg: req.alg
    }
  }, { method: req.method, url, headers });
  signed = message.headers;
}
const result = { method: req.method, url, headers: signed, public_key: publicKey };
if (req.send) {
  const res = await fetch(url, { method: req.method, headers: signed, body, redirect: 'manual' });
  Object.assign(result, { status: res.status, response: await res.text() });
}
process.stdout.write(JSON.stringify(result) + '\n');
