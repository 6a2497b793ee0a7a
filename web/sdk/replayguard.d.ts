// Type declarations for the Replayguard browser SDK (replayguard.js and
// replayguard.mjs).

/** The SDK's configuration; every field has a documented default. */
export interface ReplayGuardConfig {
  /** Token endpoint. Default "/v1/tokens" (same origin); the script tag's data-endpoint overrides it. */
  endpoint: string;
  /** Name of the hidden input that carries a form's token. Default "idempotency_token". */
  field: string;
  /** Header that carries the token on fetch requests. Default "Idempotency-Token". */
  header: string;
  /** fetch credentials mode of every request the SDK makes. Default "same-origin". */
  credentials: RequestCredentials;
  /** Retries of ReplayGuard.fetch after a network failure, with the same token. Default 3. */
  retries: number;
  /**
   * Milliseconds the submit controls stay disabled after a submission that
   * does not leave the page: one to another window or frame (target or
   * formtarget "_blank", a window's or an iframe's name), or one marked
   * data-replayguard-download. Default 1000: a double click is swallowed.
   */
  guard: number;
}

/** Why a token could not be had: the detail of replayguard:error. */
export interface ReplayGuardFailure {
  reason: 'network' | 'rate_limited' | 'server';
  /** The HTTP status; 0 when no response arrived. */
  status: number;
}

export interface ReplayGuardStatic {
  readonly version: string;
  /** Changes the configuration and returns the configuration in force. */
  configure(opts?: Partial<ReplayGuardConfig>): ReplayGuardConfig;
  /** Fetches a fresh token for purpose (default "default"); rejects with a ReplayGuardFailure. */
  token(purpose?: string): Promise<string>;
  /**
   * fetch with an idempotency token in the token header; on a network failure
   * before any response it retries with the same token, with backoff.
   */
  fetch(input: RequestInfo | URL, init?: RequestInit, opts?: { purpose?: string; token?: string }): Promise<Response>;
  /**
   * Submits a protected form through fetch. A redirected response (303) is
   * followed with location.replace; any other is dispatched as
   * replayguard:submit-end. Resolves to undefined when nothing was sent.
   */
  submit(form: HTMLFormElement, submitter?: HTMLElement | null): Promise<Response | undefined>;
  /**
   * Makes form ready for a new submission after one that did not leave the
   * page (the SDK cannot see a download that was not marked
   * data-replayguard-download, or a 204): re-enables the submit controls the
   * SDK disabled and discards the form's token, so the next submission
   * carries a fresh one.
   */
  reset(form: HTMLFormElement): void;
  /** Pure helpers, exported for tests. Not part of the stable API. */
  readonly _: {
    backoff(n: number, jitter?: number): number;
    failure(status: number): ReplayGuardFailure;
    expiry(token: string): number;
    unloads(target: string | null, own: string): boolean;
  };
}

export interface ReplayGuardEventMap {
  'replayguard:token': CustomEvent<{ token: string; purpose: string }>;
  'replayguard:submit-start': CustomEvent<{ submitter: HTMLElement | null }>;
  'replayguard:submit-end': CustomEvent<{ response: Response }>;
  'replayguard:error': CustomEvent<ReplayGuardFailure>;
}

declare global {
  interface Window {
    ReplayGuard: ReplayGuardStatic;
  }
  interface DocumentEventMap extends ReplayGuardEventMap {}
  interface HTMLElementEventMap extends ReplayGuardEventMap {}
}

declare const ReplayGuard: ReplayGuardStatic;
export { ReplayGuard };
export default ReplayGuard;
