/*! Replayguard request signer | RFC 9421 HTTP Message Signatures on WebCrypto | Apache-2.0 */
// @ts-self-types="./signer.d.mts"
//
// Signs outgoing requests for Replayguard's replay windows: an RFC 9421
// signature with `created`, a random `nonce`, `keyid` and `alg`, covering
// @method @authority @path @query and, when there is a body, an RFC 9530
// Content-Digest. One dependency-free ES module on WebCrypto
// (globalThis.crypto.subtle, or node:crypto's webcrypto on Node 18): for
// Node 18+, Deno, Bun and workers (Cloudflare, Vercel, Deno Deploy).
//
// NOT FOR BROWSERS. A signing key is a credential: a shared secret or a
// private key shipped to a web page can be read by every visitor, who can
// then sign anything as you. Sign on your servers; web pages use
// replayguard.js (single-use form tokens) instead.
//
//   import { createSignedFetch } from './signer.mjs';
//   const signedFetch = createSignedFetch({ keyId: 'partner-1', alg: 'hmac-sha256', key: secretBytes });
//   await signedFetch('https://api.example.com/v1/orders', { method: 'POST', body: JSON.stringify(order) });
'use strict';

/**
 * @typedef {import('./signer.mjs').Algorithm} Algorithm
 * @typedef {import('./signer.mjs').SignOptions} SignOptions
 * @typedef {import('./signer.mjs').SignedFetchOptions} SignedFetchOptions
 * @typedef {import('./signer.mjs').SignedHeaders} SignedHeaders
 * @typedef {import('./signer.mjs').MessageLike} MessageLike
 * @typedef {import('./signer.mjs').HeadersLike} HeadersLike
 * @typedef {import('./signer.mjs').BodyLike} BodyLike
 * @typedef {import('./signer.mjs').SignatureParam} SignatureParam
 * @typedef {import('./signer.mjs').KeyLike} KeyLike
 * @typedef {string | number | boolean} BareItem an RFC 8941 bare item (strings, integers, booleans only)
 * @typedef {{method: string, url: URL, headers: HeadersLike, body: Uint8Array | null, digest?: string}} Message
 *   digest: the Content-Digest we computed, which takes the place of the request's
 */

/** Components covered by default; content-digest is added when there is a body. */
export const DEFAULT_COMPONENTS = Object.freeze(['@method', '@authority', '@path', '@query']);

/** Signature parameters written by default, in this order; expires only when given. */
export const DEFAULT_PARAMS = Object.freeze(/** @type {SignatureParam[]} */ (['created', 'expires', 'nonce', 'keyid', 'alg']));

const ALGS = { 'hmac-sha256': 'HMAC', ed25519: 'Ed25519' };
const DIGESTS = { 'sha-256': 'SHA-256', 'sha-512': 'SHA-512' };
// DER prefix of a PKCS #8 Ed25519 private key (RFC 8410); the 32-byte seed follows.
const PKCS8_ED25519 = [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
const MAX_SF_INTEGER = 999999999999999;
const MAX_NONCE = 128; // the longest nonce Replayguard accepts, in bytes (ASCII)

// ---------------------------------------------------------------- WebCrypto

/** @type {Promise<Crypto> | undefined} */
let cryptoPromise;

/**
 * WebCrypto: the global one, or node:crypto's on Node 18, where it is not
 * global by default.
 * @returns {Promise<Crypto>}
 */
function webCrypto() {
  return (cryptoPromise ||= (async () => {
    const g = /** @type {any} */ (globalThis);
    if (g.crypto && g.crypto.subtle) return g.crypto;
    const name = 'node:crypto'; // a variable, so bundlers for workers leave it alone
    try {
      const m = await import(name);
      if (m.webcrypto && m.webcrypto.subtle) return m.webcrypto;
    } catch (e) {
      // not Node: fall through
    }
    cryptoPromise = undefined;
    throw new Error('replayguard signer: no WebCrypto (globalThis.crypto.subtle) in this runtime');
  })());
}

// ---------------------------------------------------------------- bytes

/**
 * A body or key as bytes; null for null or undefined.
 * @param {BodyLike | undefined} v
 * @param {string} what for the error message
 * @returns {Uint8Array<ArrayBuffer> | null} a copy, never shared memory
 */
function toBytes(v, what) {
  if (v == null) return null;
  if (typeof v === 'string') return new TextEncoder().encode(v);
  if (v instanceof ArrayBuffer || ArrayBuffer.isView(v)) {
    const src = v instanceof ArrayBuffer ? new Uint8Array(v) : new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
    const b = new Uint8Array(src.length);
    b.set(src);
    return b;
  }
  throw new TypeError('replayguard signer: ' + what + ' must be a string, ArrayBuffer or typed array (pass a Request for other bodies)');
}

/**
 * Standard base64 with padding.
 * @param {ArrayBuffer | Uint8Array} buf
 */
function base64(buf) {
  const b = buf instanceof Uint8Array ? buf : new Uint8Array(buf);
  let s = '';
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode.apply(null, Array.from(b.subarray(i, i + 0x8000)));
  return btoa(s);
}

/** @param {string} s standard base64, whitespace allowed */
function unbase64(s) {
  const bin = atob(s.replace(/\s+/g, ''));
  const b = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) b[i] = bin.charCodeAt(i);
  return b;
}

/** A fresh nonce: 16 random bytes, base64url without padding (22 characters). */
async function newNonce() {
  const c = await webCrypto();
  return base64(c.getRandomValues(new Uint8Array(16))).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

/**
 * The value of an RFC 9530 Content-Digest field for body, e.g.
 * sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=: for {"hello": "world"}.
 * @param {BodyLike} body
 * @param {'sha-256' | 'sha-512'} [alg] defaults to sha-256
 * @returns {Promise<string>}
 */
export async function contentDigest(body, alg = 'sha-256') {
  const hash = DIGESTS[alg];
  if (!hash) throw new TypeError('replayguard signer: digest algorithm must be sha-256 or sha-512');
  const c = await webCrypto();
  const data = toBytes(body, 'body') || new Uint8Array(0);
  return alg + '=:' + base64(await c.subtle.digest(hash, data)) + ':';
}

// ---------------------------------------------------------------- RFC 8941

/**
 * An sf-string: printable ASCII, with \ and " escaped.
 * @param {string} s
 */
function sfString(s) {
  if (typeof s !== 'string' || !/^[\x20-\x7e]*$/.test(s)) {
    throw new TypeError('replayguard signer: ' + JSON.stringify(s) + ' is not a structured-field string (printable ASCII only)');
  }
  return '"' + s.replace(/[\\"]/g, '\\$&') + '"';
}

/**
 * An sf-key: parameter names and signature labels.
 * @param {string} k
 */
function sfKey(k) {
  if (typeof k !== 'string' || !/^[a-z*][a-z0-9_.*-]*$/.test(k)) {
    throw new TypeError('replayguard signer: ' + JSON.stringify(k) + ' is not a structured-field key');
  }
  return k;
}

/** @param {BareItem} v */
function sfBareItem(v) {
  if (typeof v === 'boolean') return v ? '?1' : '?0';
  if (typeof v === 'number') {
    if (!Number.isInteger(v) || Math.abs(v) > MAX_SF_INTEGER) throw new TypeError('replayguard signer: ' + v + ' is not a structured-field integer');
    return String(v);
  }
  return sfString(v);
}

/**
 * Parameters, in the order given; `;name` alone for true.
 * @param {Array<[string, BareItem]>} params
 */
function sfParams(params) {
  return params.map(([k, v]) => ';' + sfKey(k) + (v === true ? '' : '=' + sfBareItem(v))).join('');
}

// ---------------------------------------------------------------- base

/**
 * A message's field value per RFC 9421 §2.1: each field line trimmed, obsolete
 * line folding replaced by a space, lines joined with ", "; null when absent.
 * @param {HeadersLike} headers
 * @param {string} name lowercase
 * @returns {string | null}
 */
function fieldValue(headers, name) {
  /** @type {readonly string[]} */
  let lines;
  if (typeof Headers !== 'undefined' && headers instanceof Headers) {
    const v = headers.get(name);
    if (v === null) return null;
    lines = [v];
  } else {
    const rec = /** @type {Record<string, string | readonly string[]>} */ (headers);
    const k = Object.keys(rec).find((h) => h.toLowerCase() === name);
    if (k === undefined || rec[k] == null) return null;
    const v = rec[k];
    lines = typeof v === 'string' ? [v] : v;
  }
  return lines.map((l) => String(l).replace(/\r?\n[ \t]*/g, ' ').trim()).join(', ');
}

/**
 * One component's value (RFC 9421 §2.1, §2.2).
 * @param {Message} msg
 * @param {string} name
 * @returns {string}
 */
function componentValue(msg, name) {
  const u = msg.url;
  switch (name) {
    case '@method': return msg.method;
    // What fetch sends: no userinfo, no fragment, no "?" before an empty query.
    case '@target-uri': return u.protocol + '//' + u.host + (u.pathname || '/') + u.search;
    case '@authority': return u.host; // lowercase, default port omitted
    case '@scheme': return u.protocol.slice(0, -1);
    case '@request-target': return (u.pathname || '/') + u.search;
    case '@path': return u.pathname || '/';
    case '@query': return u.search || '?';
  }
  if (name.charAt(0) === '@') throw new TypeError('replayguard signer: unsupported derived component ' + name);
  if (name === 'content-digest' && msg.digest !== undefined) return msg.digest;
  const v = fieldValue(msg.headers, name);
  if (v === null) throw new TypeError('replayguard signer: the request has no ' + name + ' header to cover');
  return v;
}

/**
 * Component names, lowercased and checked: plain names only (no component
 * parameters), no duplicates, no @signature-params.
 * @param {readonly string[]} components
 */
function normaliseComponents(components) {
  /** @type {string[]} */
  const out = [];
  for (const c of components) {
    const n = String(c).toLowerCase();
    if (!/^@?[a-z0-9!#$%&'*+.^_`|~-]+$/.test(n) || n === '@signature-params') {
      throw new TypeError('replayguard signer: cannot cover component ' + JSON.stringify(c));
    }
    if (out.includes(n)) throw new TypeError('replayguard signer: component ' + n + ' listed twice');
    out.push(n);
  }
  return out;
}

/**
 * @param {Message} msg
 * @param {readonly string[]} components normalised
 * @param {Array<[string, BareItem]>} params
 * @returns {{base: string, input: string}}
 */
function buildBase(msg, components, params) {
  const input = '(' + components.map(sfString).join(' ') + ')' + sfParams(params);
  const lines = components.map((c) => sfString(c) + ': ' + componentValue(msg, c));
  lines.push('"@signature-params": ' + input);
  return { base: lines.join('\n'), input };
}

/**
 * Request or plain object → Message; reads (a clone of) a Request's body.
 * @param {Request | MessageLike} request
 * @param {boolean} readBody
 * @returns {Promise<Message>}
 */
async function toMessage(request, readBody) {
  if (!request || typeof request !== 'object') throw new TypeError('replayguard signer: request must be a Request or {method, url, headers, body}');
  if (typeof Request !== 'undefined' && request instanceof Request) {
    const body = readBody && request.body ? new Uint8Array(await request.clone().arrayBuffer()) : null;
    return { method: request.method, url: new URL(request.url), headers: request.headers, body };
  }
  const m = /** @type {MessageLike} */ (request);
  return {
    method: m.method || 'GET',
    url: new URL(String(m.url)),
    headers: m.headers || {},
    body: toBytes(m.body, 'body')
  };
}

/**
 * The RFC 9421 signature base for request, covering components with the
 * given signature parameters (in their order): for debugging and tests.
 * Every covered header must be present, Content-Digest included.
 * @param {Request | MessageLike} request
 * @param {{components: readonly string[], params: Readonly<Record<string, BareItem>>}} input
 * @returns {string}
 */
export function signatureBase(request, input) {
  if (!request || typeof request !== 'object') throw new TypeError('replayguard signer: request must be a Request or {method, url, headers, body}');
  const r = /** @type {MessageLike} */ (request);
  const msg = { method: r.method || 'GET', url: new URL(String(r.url)), headers: r.headers || {}, body: null };
  return buildBase(msg, normaliseComponents(input.components), Object.entries(input.params)).base;
}

// ---------------------------------------------------------------- keys

/**
 * @param {unknown} k
 * @returns {k is CryptoKey}
 */
function isCryptoKey(k) {
  return !!k && typeof k === 'object' && 'algorithm' in k && 'usages' in k && 'type' in k;
}

/**
 * Imports key for alg. hmac-sha256: the secret's bytes (decode the base64
 * of the keys file first). ed25519: a PKCS #8 PEM string, PKCS #8 DER
 * bytes, the 32-byte seed, or Go's 64-byte seed‖public key.
 * @param {Algorithm} alg
 * @param {KeyLike} key
 * @returns {Promise<CryptoKey>}
 */
async function importKey(alg, key) {
  if (isCryptoKey(key)) {
    if (key.algorithm.name.toLowerCase() !== ALGS[alg].toLowerCase() || key.type === 'public') {
      throw new TypeError('replayguard signer: the CryptoKey is not a ' + alg + ' signing key');
    }
    return key;
  }
  const c = await webCrypto();
  if (alg === 'hmac-sha256') {
    if (typeof key === 'string') throw new TypeError('replayguard signer: pass the hmac-sha256 secret as bytes (base64-decoded), not a string');
    const raw = toBytes(key, 'key');
    if (!raw || raw.length === 0) throw new TypeError('replayguard signer: the hmac-sha256 secret is empty');
    return c.subtle.importKey('raw', raw, { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  }
  let der;
  if (typeof key === 'string') {
    const m = /-----BEGIN PRIVATE KEY-----([\s\S]+?)-----END PRIVATE KEY-----/.exec(key);
    if (!m) throw new TypeError('replayguard signer: an ed25519 key string must be a PKCS #8 PEM "PRIVATE KEY" block');
    der = unbase64(m[1]);
  } else {
    const raw = toBytes(key, 'key') || new Uint8Array(0);
    if (raw.length === 32 || raw.length === 64) {
      der = new Uint8Array(48);
      der.set(PKCS8_ED25519);
      der.set(raw.subarray(0, 32), 16);
    } else {
      der = raw;
    }
  }
  return c.subtle.importKey('pkcs8', der, { name: 'Ed25519' }, false, ['sign']);
}

// ---------------------------------------------------------------- signing

/**
 * Seconds since the epoch from a number (seconds) or a Date.
 * @param {number | Date} t
 * @param {string} what
 */
function seconds(t, what) {
  const s = t instanceof Date ? Math.floor(t.getTime() / 1000) : t;
  if (!Number.isInteger(s)) throw new TypeError('replayguard signer: ' + what + ' must be a Date or integer seconds');
  return s;
}

/**
 * Checks options that do not depend on the request.
 * @param {SignOptions} o
 */
function checkOptions(o) {
  if (!o || typeof o !== 'object') throw new TypeError('replayguard signer: options are required');
  if (!Object.prototype.hasOwnProperty.call(ALGS, o.alg)) throw new TypeError('replayguard signer: alg must be hmac-sha256 or ed25519');
  if (typeof o.keyId !== 'string' || o.keyId === '') throw new TypeError('replayguard signer: keyId is required');
  sfString(o.keyId);
  sfKey(o.label === undefined ? 'sig1' : o.label);
  if (o.key == null) throw new TypeError('replayguard signer: key is required');
}

/**
 * Signs msg with an imported key.
 * @param {Message} msg
 * @param {SignOptions} o
 * @param {Promise<CryptoKey>} keyPromise
 * @returns {Promise<SignedHeaders>}
 */
async function sign(msg, o, keyPromise) {
  const key = await keyPromise; // first, so that a bad key is never an unhandled rejection
  const hasBody = !!msg.body && msg.body.length > 0;
  const components = normaliseComponents(o.components || (hasBody ? DEFAULT_COMPONENTS.concat('content-digest') : DEFAULT_COMPONENTS));
  /** @type {SignedHeaders} */
  const out = { 'Signature-Input': '', Signature: '' };
  if (components.includes('content-digest')) {
    // Ours replaces any Content-Digest the request came with.
    msg = { ...msg, digest: (out['Content-Digest'] = await contentDigest(msg.body)) };
  }
  /** @type {Array<[string, BareItem]>} */
  const params = [];
  for (const p of o.params || DEFAULT_PARAMS) {
    switch (p) {
      case 'created': params.push(['created', seconds(o.created === undefined ? new Date() : o.created, 'created')]); break;
      case 'expires': if (o.expires !== undefined) params.push(['expires', seconds(o.expires, 'expires')]); break;
      case 'nonce': {
        const n = o.nonce === undefined ? await newNonce() : o.nonce;
        if (typeof n !== 'string' || n.length === 0 || n.length > MAX_NONCE) throw new TypeError('replayguard signer: the nonce must be 1 to ' + MAX_NONCE + ' characters');
        params.push(['nonce', n]);
        break;
      }
      case 'keyid': params.push(['keyid', o.keyId]); break;
      case 'alg': params.push(['alg', o.alg]); break;
      default: throw new TypeError('replayguard signer: unknown signature parameter ' + JSON.stringify(p));
    }
  }
  const { base, input } = buildBase(msg, components, params);
  const c = await webCrypto();
  const data = new TextEncoder().encode(base);
  const sig = await c.subtle.sign(o.alg === 'ed25519' ? { name: 'Ed25519' } : { name: 'HMAC' }, key, data);
  const label = o.label === undefined ? 'sig1' : o.label;
  out['Signature-Input'] = label + '=' + input;
  out.Signature = label + '=:' + base64(sig) + ':';
  return out;
}

/**
 * Signs request and returns the headers to add to it: Signature-Input,
 * Signature and, when content-digest is covered (by default whenever there
 * is a non-empty body), Content-Digest. They replace any of the same name.
 * The request itself is not changed; a Request's body is read from a clone.
 * @param {Request | MessageLike} request
 * @param {SignOptions} options
 * @returns {Promise<SignedHeaders>}
 */
export async function signRequest(request, options) {
  checkOptions(options);
  const msg = await toMessage(request, true);
  return sign(msg, options, importKey(options.alg, options.key));
}

/**
 * Wraps fetch so that every request is signed, each with a fresh nonce and
 * created time. The key is imported once, on first use.
 * @param {SignedFetchOptions} options
 * @returns {(input: RequestInfo | URL, init?: RequestInit) => Promise<Response>}
 */
export function createSignedFetch(options) {
  checkOptions(options);
  const o = /** @type {SignOptions & {fetch?: unknown}} */ (options);
  if (o.nonce !== undefined || o.created !== undefined || o.expires !== undefined) {
    throw new TypeError('replayguard signer: createSignedFetch makes nonce and created per request; fixed values are for signRequest');
  }
  const doFetch = options.fetch || ((/** @type {Request} */ r) => globalThis.fetch(r));
  /** @type {Promise<CryptoKey> | undefined} */
  let keyPromise;
  return async function signedFetch(input, init) {
    const req = new Request(input, init);
    const body = req.body ? new Uint8Array(await req.arrayBuffer()) : null;
    const headers = new Headers(req.headers);
    const add = await sign({ method: req.method, url: new URL(req.url), headers, body }, options, (keyPromise ||= importKey(options.alg, options.key)));
    for (const [k, v] of Object.entries(add)) {
      if (v !== undefined) headers.set(k, v);
    }
    return doFetch(new Request(req, body ? { headers, body } : { headers }));
  };
}
