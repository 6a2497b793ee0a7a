// Type declarations for the Replayguard request signer, signer.mjs (TypeScript
// pairs a .d.mts with an .mjs; Deno finds it through @ts-self-types): RFC 9421
// HTTP Message Signatures on WebCrypto for Node 18+, Deno, Bun and workers.
// Not for browsers: a signing key in a web page is readable by every visitor.

/** The signature algorithms Replayguard accepts (RFC 9421 §3.3). */
export type Algorithm = 'hmac-sha256' | 'ed25519';

/** Signature parameters the signer can write (RFC 9421 §2.3). */
export type SignatureParam = 'created' | 'expires' | 'nonce' | 'keyid' | 'alg';

/** Headers as a Headers object or a record; names are matched case-insensitively. */
export type HeadersLike = Headers | Record<string, string | readonly string[]>;

/** A body the signer can digest; pass a Request for streams and forms. */
export type BodyLike = string | ArrayBuffer | ArrayBufferView | null;

/**
 * A signing key. hmac-sha256: the shared secret's bytes (base64-decode the
 * keys file's "secret"; strings are refused). ed25519: a PKCS #8 PEM
 * "PRIVATE KEY" string, PKCS #8 DER bytes, the raw 32-byte seed, or Go's
 * 64-byte ed25519.PrivateKey. Or a WebCrypto CryptoKey (HMAC SHA-256 or
 * Ed25519 private key, usage "sign").
 */
export type KeyLike = CryptoKey | ArrayBuffer | ArrayBufferView | string;

/** A request described by its parts, when a Request object is not at hand. */
export interface MessageLike {
  /** The method, as sent. Default "GET". */
  method?: string;
  /** The absolute target URI. */
  url: string | URL;
  headers?: HeadersLike;
  body?: BodyLike;
}

export interface SignOptions {
  /** The key ID the server knows the key by: the keyid parameter. */
  keyId: string;
  alg: Algorithm;
  key: KeyLike;
  /** Covered components. Default @method @authority @path @query, plus content-digest when the body is not empty. */
  components?: readonly string[];
  /** Parameters to write, in order. Default created, expires (only when given), nonce, keyid, alg. */
  params?: readonly SignatureParam[];
  /** The created time: a Date or seconds since the epoch. Default now. For tests. */
  created?: number | Date;
  /** An expires time: a Date or seconds since the epoch. Default none. */
  expires?: number | Date;
  /** The nonce. Default 16 random bytes, base64url (22 characters). For tests: a fixed nonce is replayed. */
  nonce?: string;
  /** The signature's label in Signature-Input and Signature. Default "sig1". */
  label?: string;
}

/** Options of createSignedFetch: every request gets its own nonce and created time. */
export interface SignedFetchOptions extends Omit<SignOptions, 'created' | 'expires' | 'nonce'> {
  /** The fetch to send signed requests with. Default globalThis.fetch. */
  fetch?: (request: Request) => Promise<Response>;
}

/** The headers to add to a signed request; they replace any of the same name. */
export interface SignedHeaders {
  'Signature-Input': string;
  Signature: string;
  /** Present when content-digest is covered. */
  'Content-Digest'?: string;
}

/** Components covered by default: @method @authority @path @query. */
export const DEFAULT_COMPONENTS: readonly string[];

/** Parameters written by default, in order: created, expires (only when given), nonce, keyid, alg. */
export const DEFAULT_PARAMS: readonly SignatureParam[];

/**
 * Signs request and resolves to the headers to add. The request is not
 * changed; a Request's body is read from a clone.
 */
export function signRequest(request: Request | MessageLike, options: SignOptions): Promise<SignedHeaders>;

/** Wraps fetch so that every request is signed with a fresh nonce and created time. */
export function createSignedFetch(options: SignedFetchOptions): (input: RequestInfo | URL, init?: RequestInit) => Promise<Response>;

/** The RFC 9530 Content-Digest value for body: "sha-256=:…:" (or sha-512). */
export function contentDigest(body: BodyLike, alg?: 'sha-256' | 'sha-512'): Promise<string>;

/**
 * The RFC 9421 signature base for request over components with params, in
 * their order; for debugging and tests. Every covered header must be present.
 */
export function signatureBase(
  request: Request | MessageLike,
  input: { components: readonly string[]; params: Readonly<Record<string, string | number | boolean>> }
): string;
