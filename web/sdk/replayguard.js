/*! Replayguard browser SDK | one token per form, no double submits, Post-Redirect-Get | Apache-2.0 */
// One dependency-free file: load it as a classic <script> (it defines
// window.ReplayGuard) or import replayguard.mjs, which re-exports the same
// object. Any <form data-replayguard="PURPOSE"> on the page, now or added
// later, is protected without further code.
'use strict';
(function (g) {
  /**
   * @typedef {{endpoint: string, field: string, header: string,
   *   credentials: RequestCredentials, retries: number, guard: number}} Config
   * @typedef {{reason: 'network' | 'rate_limited' | 'server', status: number}} Failure
   * @typedef {{t: string, u?: 1, x?: 1}} Saved a form's token; u: the form
   *   submitted it; x: a submission that stayed on the page spent it
   * @typedef {{busy?: boolean, pending?: Promise<string>, timer?: number,
   *   carried?: boolean}} FormState carried: the submission under way sends
   *   the token an earlier one from this history entry sent
   */

  /** @type {Config} */
  var cfg = {
    // Token endpoint: same-origin by default. A data-endpoint attribute on
    // the script tag or configure({endpoint}) points it at a cross-origin
    // Replayguard whose REPLAYGUARD_CORS_ORIGINS lists this page's origin.
    endpoint: '/v1/tokens',
    // Hidden input that carries a form's token.
    field: 'idempotency_token',
    // Header that carries the token on fetch requests.
    header: 'Idempotency-Token',
    // fetch credentials mode for every request the SDK makes.
    credentials: 'same-origin',
    // How often ReplayGuard.fetch retries, with the same token, when the
    // network fails before any response arrives.
    retries: 3,
    // Milliseconds the submit controls stay disabled after a submission
    // that does not leave the page (to another window or frame, or
    // answered with a download): long enough to swallow a double click.
    guard: 1000
  };
  var doc = g.document;
  var PREFIX = 'replayguard:';
  var MARK = 'data-replayguard-disabled';
  /** @type {WeakMap<HTMLFormElement, FormState>} */
  var states = new WeakMap();

  /**
   * Retry delay in ms before attempt n (1-based): 250, 500, 1000, capped
   * at 2000, plus up to 100 ms of jitter.
   * @param {number} n
   * @param {number} [jitter] a number in [0, 1); defaults to Math.random()
   */
  function backoff(n, jitter) {
    return Math.min(250 * Math.pow(2, n - 1), 2000) + Math.floor((jitter === undefined ? Math.random() : jitter) * 100);
  }

  /**
   * The failure reason for an HTTP status (0: no response at all).
   * @param {number} status
   * @returns {Failure}
   */
  function failure(status) {
    return { reason: status ? (status == 429 ? 'rate_limited' : 'server') : 'network', status: status };
  }

  /**
   * The exp claim of a JWT, in ms since the epoch; 0 when unreadable.
   * @param {string} token
   */
  function expiry(token) {
    try {
      var p = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
      return JSON.parse(g.atob(p)).exp * 1000 || 0;
    } catch (e) {
      return 0;
    }
  }

  /**
   * Dispatches replayguard:NAME on el; false when a listener cancelled it.
   * @param {EventTarget} el
   * @param {string} name
   * @param {object} detail
   * @param {boolean} [cancelable]
   */
  function emit(el, name, detail, cancelable) {
    return el.dispatchEvent(new CustomEvent(PREFIX + name, { bubbles: true, cancelable: !!cancelable, detail: detail }));
  }

  /**
   * Fetches a fresh token for purpose.
   * @param {string} [purpose]
   * @returns {Promise<string>} rejects with a Failure
   */
  function token(purpose) {
    return g.fetch(cfg.endpoint, {
      method: 'POST',
      credentials: cfg.credentials,
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ purpose: purpose || 'default' })
    }).then(function (/** @type {Response} */ r) {
      if (!r.ok) throw failure(r.status);
      return r.json().then(function (/** @type {{token: string}} */ j) { return j.token; });
    }, function () {
      throw failure(0);
    });
  }

  /** @param {HTMLFormElement} form */
  function state(form) {
    var s = states.get(form);
    if (!s) states.set(form, (s = {}));
    return s;
  }

  /** @param {EventTarget | null} el */
  function protectedForm(el) {
    var f = el instanceof Element && el.closest('form');
    return f && f.hasAttribute('data-replayguard') ? /** @type {HTMLFormElement} */ (f) : null;
  }

  /**
   * The key of a form instance in history.state: the same form on the same
   * history entry keeps its token across reloads, Back and Forward.
   * @param {HTMLFormElement} form
   */
  function key(form) {
    return form.id || form.getAttribute('data-replayguard') + '#' + Array.prototype.indexOf.call(doc.forms, form);
  }

  /** @returns {Record<string, Saved>} */
  function saved() {
    var s = g.history.state;
    return (s && s.replayguard) || {};
  }

  /**
   * The form's token input, if it has one.
   * @param {HTMLFormElement} form
   * @returns {HTMLInputElement | null}
   */
  function field(form) {
    return form.querySelector('input[name="' + cfg.field + '"]');
  }

  /**
   * Appends a hidden input to form and returns it.
   * @param {HTMLFormElement} form
   * @param {string} name
   * @param {string} value
   */
  function hidden(form, name, value) {
    /** @type {HTMLInputElement} */
    var el = doc.createElement('input');
    el.type = 'hidden';
    el.name = name;
    el.value = value;
    return form.appendChild(el);
  }

  /**
   * Remembers form's token in the hidden input and in history.state.
   * mark 'u': this form instance submitted it, so a resubmission (after
   * Back, say) must carry it again and reach the server as the duplicate
   * it is. mark 'x': a submission that stayed on the page spent
   * it; the input is emptied and the token is never used again (not even
   * when an HTTP-cached copy of the page renders it), so the next
   * submission gets a fresh one.
   * @param {HTMLFormElement} form
   * @param {string} tok
   * @param {'u' | 'x'} [mark]
   */
  function keep(form, tok, mark) {
    var input = field(form);
    var v = mark == 'x' ? '' : tok;
    if (input) input.value = v;
    else hidden(form, cfg.field, v);
    var all = saved();
    /** @type {Saved} */
    var s = { t: tok };
    if (mark) s[mark] = 1;
    all[key(form)] = s;
    try {
      g.history.replaceState(Object.assign({}, g.history.state, { replayguard: all }), '');
    } catch (e) { /* history unavailable (sandboxed frame): the input still holds it */ }
  }

  /**
   * The form's token: the one it already submitted from this history entry
   * (history.state), else the one in its hidden input (server-rendered or
   * restored from the back/forward cache), else an unsubmitted one
   * history.state kept, else a fresh one. An unsubmitted token that has expired is
   * replaced; a submitted one is kept, so a resubmission reaches the server
   * as the duplicate it is; one spent by a submission that stayed on the
   * page is replaced.
   * @param {HTMLFormElement} form
   * @returns {Promise<string>}
   */
  function formToken(form) {
    var st = state(form);
    var input = field(form);
    var s = saved()[key(form)];
    // A token this form already submitted from this history entry wins:
    // when Back or Reload fetched the page again, the server rendered a
    // fresh token, but it is still the same form instance.
    var tok = (s && s.u && s.t) || (input && input.value) || (s && s.t);
    if (s && s.x && s.t == tok) tok = '';
    if (tok && ((s && s.t == tok && s.u) || expiry(tok) > Date.now() + 5000)) {
      if (!input || input.value != tok) keep(form, tok, s && s.t == tok && s.u ? 'u' : undefined);
      return Promise.resolve(tok);
    }
    if (!st.pending) {
      var purpose = form.getAttribute('data-replayguard') || 'default';
      st.pending = token(purpose).then(function (t) {
        keep(form, t);
        emit(form, 'token', { token: t, purpose: purpose });
        return t;
      });
      st.pending.then(function () { st.pending = undefined; }, function () { st.pending = undefined; });
    }
    return st.pending;
  }

  /**
   * Disables every enabled submit control of form (swapping the label of
   * those with data-disable-with) and marks the form busy.
   * @param {HTMLFormElement} form
   */
  function disable(form) {
    form.setAttribute('aria-busy', 'true');
    [].forEach.call(form.elements, function (/** @type {HTMLButtonElement | HTMLInputElement} */ el) {
      if (el.type == 'submit' || el.type == 'image') {
        if (el.disabled) return;
        el.disabled = true;
        el.setAttribute(MARK, '');
        var w = el.getAttribute('data-disable-with');
        if (w != null) {
          var input = el instanceof HTMLInputElement;
          el.setAttribute('data-replayguard-label', input ? el.value : el.innerHTML);
          if (input) el.value = w; else el.textContent = w;
        }
      }
    });
  }

  /**
   * Re-enables only the controls disable() disabled and restores labels.
   * @param {HTMLFormElement} form
   */
  function enable(form) {
    var st = state(form);
    clearTimeout(st.timer);
    form.removeAttribute('aria-busy');
    st.busy = false;
    // form.elements includes submit buttons outside the form (form="id").
    [].forEach.call(form.elements, function (/** @type {HTMLButtonElement | HTMLInputElement} */ el) {
      if (!el.hasAttribute(MARK)) return;
      var label = el.getAttribute('data-replayguard-label');
      if (label != null) {
        if (el instanceof HTMLInputElement) el.value = label; else el.innerHTML = label;
        el.removeAttribute('data-replayguard-label');
      }
      el.disabled = false;
      el.removeAttribute(MARK);
    });
  }

  /**
   * Starts protected submission of form: swallows it when one is under
   * way, asks submit-start listeners, disables the controls and gets the
   * form's token. Resolves to the token, or to '' when nothing may be sent.
   * @param {HTMLFormElement} form
   * @param {HTMLElement | null} submitter
   * @returns {Promise<string>}
   */
  function begin(form, submitter) {
    var st = state(form);
    if (st.busy || !emit(form, 'submit-start', { submitter: submitter }, true)) return Promise.resolve('');
    st.busy = true;
    disable(form);
    return formToken(form).then(function (tok) {
      var was = saved()[key(form)];
      st.carried = !!(was && was.u && was.t == tok);
      keep(form, tok, 'u');
      return tok;
    }, function (/** @type {Failure} */ f) {
      enable(form);
      emit(form, 'error', f);
      return '';
    });
  }

  /**
   * A form attribute as a submission by sub sees it: the submitter's
   * formaction (...) when it has one, else the form's own, null when
   * neither has it. An attribute that is there wins, even empty, as HTML
   * says.
   * @param {HTMLFormElement} form
   * @param {HTMLElement | null} sub
   * @param {string} name action, method, enctype or target
   */
  function attr(form, sub, name) {
    return sub && sub.hasAttribute('form' + name) ? sub.getAttribute('form' + name) : form.getAttribute(name);
  }

  /**
   * Where a submission of form by sub goes: the submitter's formtarget if
   * it has one, else the form's target if it has one, else the page's
   * base target, as HTML says; an empty one, or none, is _self. navigate()
   * pins it on the form, for Chromium takes an empty target for none and
   * uses the base target instead.
   * @param {HTMLFormElement} form
   * @param {HTMLElement | null} sub
   */
  function aim(form, sub) {
    var t = attr(form, sub, 'target');
    var base = doc.querySelector('base[target]');
    return (t == null ? base && base.getAttribute('target') : t) || '_self';
  }

  /**
   * Whether a form submitted to target (see aim) replaces this page:
   * no target, _self, _parent and _top (this frame or one around it) and
   * this window's own name do; _blank and any other name (another tab,
   * window or iframe) do not. Keywords are case-insensitive, names not.
   * @param {string | null} target
   * @param {string} own this window's name
   */
  function unloads(target, own) {
    return !target || /^_(self|parent|top)$/i.test(target) || target == own;
  }

  /**
   * Marks the token form carries as spent by a submission that stayed on
   * the page: the next submission gets a fresh one.
   * @param {HTMLFormElement} form
   */
  function spend(form) {
    var input = field(form);
    var s = saved()[key(form)];
    keep(form, (input && input.value) || (s && s.t) || '', 'x');
  }

  /**
   * Submits form as a normal navigation, as the submitter would have: its
   * name and value are sent and its formaction, formmethod, formenctype and
   * formtarget apply, the target as aim() resolves it. Validation already
   * ran before the submit event.
   * @param {HTMLFormElement} form
   * @param {HTMLElement | null} sub
   */
  function navigate(form, sub) {
    var names = ['action', 'method', 'enctype', 'target'];
    var old = names.map(function (n) { return form.getAttribute(n); });
    names.forEach(function (n) {
      var v = n == 'target' ? aim(form, sub) : attr(form, sub, n);
      if (v != null) form.setAttribute(n, v);
    });
    var name = sub && sub.getAttribute('name');
    var extra = name && hidden(form, name, /** @type {HTMLButtonElement} */ (sub).value);
    HTMLFormElement.prototype.submit.call(form);
    if (extra) form.removeChild(extra);
    names.forEach(function (n, i) {
      if (old[i] == null) form.removeAttribute(n); else form.setAttribute(n, /** @type {string} */ (old[i]));
    });
  }

  /**
   * fetch with an idempotency token: sends it in the token header and, when
   * the network fails before a response arrives, retries with the same
   * token (cfg.retries times, with backoff), so a retry can never become a
   * second execution.
   * @param {RequestInfo | URL} input
   * @param {RequestInit} [init]
   * @param {{purpose?: string, token?: string}} [opts]
   * @returns {Promise<Response>}
   */
  function rgFetch(input, init, opts) {
    opts = opts || {};
    return (opts.token ? Promise.resolve(opts.token) : token(opts.purpose)).then(function (tok) {
      var req = new Request(input, Object.assign({ credentials: cfg.credentials }, init));
      req.headers.set(cfg.header, tok);
      var n = 0;
      /** @returns {Promise<Response>} */
      function attempt() {
        return g.fetch(req.clone()).catch(function (/** @type {unknown} */ err) {
          if (++n > cfg.retries || req.signal.aborted) throw err;
          return new Promise(function (ok) { setTimeout(ok, backoff(n)); }).then(attempt);
        });
      }
      return attempt();
    });
  }

  /**
   * Submits a protected form through fetch. A redirected answer (303 See
   * Other) is followed with location.replace, so Reload and Back cannot
   * resubmit; any other answer re-enables the form and is dispatched as
   * replayguard:submit-end for the page to render. Resolves to the
   * response, or undefined when nothing was sent.
   * @param {HTMLFormElement} form
   * @param {HTMLElement | null} [submitter]
   * @returns {Promise<Response | undefined>}
   */
  function submit(form, submitter) {
    var sub = submitter || null;
    return begin(form, sub).then(function (tok) {
      if (!tok) return;
      var method = (attr(form, sub, 'method') || 'get').toUpperCase();
      var url = new URL(attr(form, sub, 'action') || g.location.href, g.location.href);
      // begin() has disabled the submitter, and FormData leaves disabled
      // controls out: add its name and value as navigate() does.
      var data = new FormData(form);
      var name = sub && sub.getAttribute('name');
      if (name) data.append(name, /** @type {HTMLButtonElement} */ (sub).value);
      /** @type {BodyInit | undefined} */
      var body = data;
      if (method == 'GET') {
        url.search = '' + new URLSearchParams(/** @type {any} */ (data));
        body = undefined;
      } else if (attr(form, sub, 'enctype') != 'multipart/form-data') {
        body = new URLSearchParams(/** @type {any} */ (data));
      }
      return rgFetch(url, { method: method, body: body }, { token: tok }).then(function (res) {
        if (res.redirected) {
          g.location.replace(res.url);
          return res;
        }
        if (res.status == 401) keep(form, ''); // the server calls the token invalid: the next submit fetches a new one
        enable(form);
        emit(form, 'submit-end', { response: res });
        return res;
      }, function () {
        enable(form);
        emit(form, 'error', failure(0));
        return undefined;
      });
    });
  }

  // Typed with the published declarations, so the two cannot drift apart.
  /** @type {import('./replayguard').ReplayGuardStatic} */
  var ReplayGuard = {
    version: '1.1.0',
    /**
     * Changes the configuration; returns the configuration in force.
     * @param {Partial<Config>} [opts]
     */
    configure: function (opts) {
      return Object.assign(cfg, opts);
    },
    token: token,
    fetch: rgFetch,
    submit: submit,
    /**
     * Makes form ready for a new submission after one that did not leave
     * the page: re-enables the controls the SDK disabled and discards the
     * form's token, so the next submission carries a fresh one.
     * @param {HTMLFormElement} form
     */
    reset: function (form) {
      spend(form);
      enable(form);
    },
    /** Pure helpers, exported for tests. */
    _: { backoff: backoff, failure: failure, expiry: expiry, unloads: unloads }
  };
  g.ReplayGuard = ReplayGuard;

  if (!doc) return; // Node or a worker: the helpers only
  var script = doc.currentScript;
  var ep = script && script.getAttribute('data-endpoint');
  if (ep) cfg.endpoint = ep;

  /** @param {Event} e */
  function prefetch(e) {
    var form = protectedForm(/** @type {Element} */ (e.target));
    if (form) formToken(form).catch(function () { /* retried at submit */ });
  }
  doc.addEventListener('focusin', prefetch);
  doc.addEventListener('pointerdown', prefetch);
  doc.addEventListener('submit', function (/** @type {Event} */ e) {
    var form = /** @type {HTMLFormElement} */ (e.target);
    if (e.defaultPrevented || !form.hasAttribute || !form.hasAttribute('data-replayguard')) return;
    e.preventDefault();
    var sub = /** @type {SubmitEvent} */ (e).submitter;
    begin(form, sub).then(function (tok) {
      if (!tok) return;
      navigate(form, sub);
      // A submission to another window or frame, or one whose answer is a
      // download (data-replayguard-download on the form or the button),
      // leaves this page as it is: no pageshow will re-enable the
      // controls, and the token is spent. The form drops it at once (its
      // next submission fetches a fresh one) and gets its controls back
      // after cfg.guard ms, which still swallows a double click. Only a
      // token this submission brought in is dropped: one an earlier
      // submission sent (an order, then Back) stays, or the next "Place
      // order" would fetch a fresh one and order again.
      var dl = 'data-replayguard-download';
      if (!unloads(aim(form, sub), g.name) ||
          form.hasAttribute(dl) || (sub && sub.hasAttribute(dl))) {
        if (!state(form).carried) spend(form);
        state(form).timer = setTimeout(enable, cfg.guard, form);
      }
    });
  });
  // Back/forward cache: the page is back as it was left, submit controls
  // disabled. Re-enable them; the form keeps its (used) token.
  g.addEventListener('pageshow', function (/** @type {PageTransitionEvent} */ e) {
    if (e.persisted) [].forEach.call(doc.querySelectorAll('form[data-replayguard][aria-busy]'), enable);
  });
})(typeof window != 'undefined' ? window : /** @type {any} */ (globalThis));
