// Verifies one signed request with the independent implementation (the npm
// package http-message-signatures) for the Go interoperability test
// (replay/interop_test.go). Reads from stdin:
//   {"method", "url", "headers": {"name": "value"}, "body": "<base64>" | null,
//    "keys": [{"id", "alg", "secret": "<base64>" | "public_key": "<SPKI PEM>"}]}
// and exits 0 only when the signature verifies, with created, nonce, keyid and
// alg present, @method @authority @path @query covered, and content-digest
// covered and matching the body whenever there is one (the package does not
// check digests itself, so that part is done here with node:crypto).
import { createHash, createPublicKey } from 'node:crypto';
import { httpbis, createVerifier } from 'http-message-signatures';

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const req = JSON.parse(Buffer.concat(chunks).toString('utf8'));

function fail(why) {
  process.stderr.write(`not verified: ${why}\n`);
  process.exit(1);
}

const body = req.body == null ? Buffer.alloc(0) : Buffer.from(req.body, 'base64');
const required = ['@method', '@authority', '@path', '@query'];
if (body.length) {
  required.push('content-digest');
  const field = Object.entries(req.headers).find(([k]) => k.toLowerCase() === 'content-digest')?.[1] || '';
  const matches = ['sha-256', 'sha-512'].filter((alg) =>
    field.split(',').map((m) => m.trim()).includes(`${alg}=:${createHash(alg.replace('-', '')).update(body).digest('base64')}:`));
  if (!matches.length) fail(`Content-Digest ${JSON.stringify(field)} does not match the body`);
}

const keys = new Map(req.keys.map((k) => [k.id, {
  id: k.id,
  algs: [k.alg],
  verify: createVerifier(k.alg === 'hmac-sha256' ? Buffer.from(k.secret, 'base64') : createPublicKey(k.public_key), k.alg)
}]));

try {
  const ok = await httpbis.verifyMessage({
    keyLookup: async ({ keyid }) => keys.get(keyid) ?? null,
    requiredParams: ['created', 'nonce', 'keyid', 'alg'],
    requiredFields: required,
    maxAge: 300,
    tolerance: 5,
    all: true
  }, { method: req.method, url: req.url, headers: req.headers });
  if (ok !== true) fail(`verifyMessage returned ${ok}`);
} catch (e) {
  fail(e && e.message);
}
process.stdout.write('verified\n');
