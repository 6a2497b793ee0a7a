package guard_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/webhook"
)

const (
	hookSecret  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	stripeHook  = "whsec_stripe_endpoint_secret"
	slackSigner = "slack signing secret"
	githubHook  = "github webhook secret"
)

// countingStore counts the store calls a middleware makes and the
// retention of each completed record.
type countingStore struct {
	store.Store
	acquires  atomic.Int32
	retention atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, key, fp, owner string, ttl time.Duration) (store.Record, bool, error) {
	c.acquires.Add(1)
	return c.Store.Acquire(ctx, key, fp, owner, ttl)
}

func (c *countingStore) Complete(ctx context.Context, key, owner string, resp []byte, ttl time.Duration) (bool, error) {
	c.retention.Store(int64(ttl))
	return c.Store.Complete(ctx, key, owner, resp, ttl)
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func mustB64(s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func newCountingStore(t *testing.T) *countingStore {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	return &countingStore{Store: st}
}

// standardDelivery signs a Standard Webhooks delivery of id at ts, with
// the test's own HMAC (not the package's Signer).
func standardDelivery(id string, ts time.Time, body string) *http.Request {
	t := strconv.FormatInt(ts.Unix(), 10)
	m := hmac.New(sha256.New, mustB64(strings.TrimPrefix(hookSecret, "whsec_")))
	m.Write([]byte(id + "." + t + "." + body))
	r := httptest.NewRequest(http.MethodPost, "/hooks/standard", strings.NewReader(body))
	r.Header.Set("webhook-id", id)
	r.Header.Set("webhook-timestamp", t)
	r.Header.Set("webhook-signature", "v1,"+b64(m.Sum(nil)))
	r.Header.Set("Content-Type", "application/json")
	return r
}

func stripeDelivery(ts time.Time, body string) *http.Request {
	t := strconv.FormatInt(ts.Unix(), 10)
	m := hmac.New(sha256.New, []byte(stripeHook))
	m.Write([]byte(t + "." + body))
	r := httptest.NewRequest(http.MethodPost, "/hooks/stripe", strings.NewReader(body))
	r.Header.Set("Stripe-Signature", "t="+t+",v1="+hex.EncodeToString(m.Sum(nil)))
	return r
}

func slackDelivery(ts time.Time, body string) *http.Request {
	t := strconv.FormatInt(ts.Unix(), 10)
	m := hmac.New(sha256.New, []byte(slackSigner))
	m.Write([]byte("v0:" + t + ":" + body))
	r := httptest.NewRequest(http.MethodPost, "/hooks/slack", strings.NewReader(body))
	r.Header.Set("X-Slack-Signature", "v0="+hex.EncodeToString(m.Sum(nil)))
	r.Header.Set("X-Slack-Request-Timestamp", t)
	return r
}

// githubDelivery signs a GitHub delivery of id (X-GitHub-Delivery) with
// X-Hub-Signature-256, and dates it (Date, which GitHub sends and nothing
// signs) at date.
func githubDelivery(id string, date time.Time, body string) *http.Request {
	m := hmac.New(sha256.New, []byte(githubHook))
	m.Write([]byte(body))
	r := httptest.NewRequest(http.MethodPost, "/hooks/github", strings.NewReader(body))
	r.Header.Set("X-GitHub-Delivery", id)
	r.Header.Set("X-GitHub-Event", "push")
	r.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
	r.Header.Set("Date", date.UTC().Format(http.TimeFormat))
	r.Header.Set("Content-Type", "application/json")
	return r
}

// hookApp is the protected receiver: it counts its runs per delivery ID
// and answers with answer (201 and what it saw, by default).
type hookApp struct {
	mu     sync.Mutex
	runs   map[string]int
	answer func(w http.ResponseWriter, r *http.Request, d webhook.Delivery, run int)
}

func (a *hookApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d, ok := guard.WebhookFrom(r.Context())
	if !ok {
		http.Error(w, "no delivery in the context", http.StatusTeapot)
		return
	}
	a.mu.Lock()
	if a.runs == nil {
		a.runs = map[string]int{}
	}
	a.runs[d.ID]++
	n := a.runs[d.ID]
	a.mu.Unlock()
	if a.answer != nil {
		a.answer(w, r, d, n)
		return
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%q,"run":%d,"got":%q}`, d.ID, n, body)
}

func (a *hookApp) count(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[id]
}

// hookShape mounts POST /hooks/{standard,stripe,github,slack} and POST
// /hooks/other (a second standard route) behind RequireWebhook, with one
// middleware shape.
type hookShape struct {
	name  string
	mount func(mws map[string]func(http.Handler) http.Handler, app http.Handler) http.Handler
}

var hookShapes = []hookShape{
	{"net/http", func(mws map[string]func(http.Handler) http.Handler, app http.Handler) http.Handler {
		mux := http.NewServeMux()
		for path, mw := range mws {
			mux.Handle("POST "+path, mw(app))
		}
		return mux
	}},
	{"gin", func(mws map[string]func(http.Handler) http.Handler, app http.Handler) http.Handler {
		r := gin.New()
		_ = r.SetTrustedProxies(nil)
		for path, mw := range mws {
			r.POST(path, guard.Gin(mw), gin.WrapH(app))
		}
		return r
	}},
}

// hookEnv is a receiver under test.
type hookEnv struct {
	h   http.Handler
	app *hookApp
	st  *countingStore
}

func newHookEnv(t *testing.T, shape hookShape, app *hookApp, st store.Store, kopts []idempotency.Option, opts ...guard.Option) *hookEnv {
	t.Helper()
	cs := newCountingStore(t)
	if st != nil {
		cs.Store = st
	}
	keeper := idempotency.New(cs, kopts...)
	verifier := func(s webhook.Scheme, secret string) *webhook.Verifier {
		v, err := webhook.New(s, []string{secret})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	std := verifier(webhook.Standard, hookSecret)
	mws := map[string]func(http.Handler) http.Handler{
		"/hooks/standard": guard.RequireWebhook(std, keeper, opts...),
		"/hooks/other":    guard.RequireWebhook(std, keeper, opts...),
		"/hooks/stripe":   guard.RequireWebhook(verifier(webhook.Stripe, stripeHook), keeper, opts...),
		"/hooks/github":   guard.RequireWebhook(verifier(webhook.GitHub, githubHook), keeper, opts...),
		"/hooks/slack":    guard.RequireWebhook(verifier(webhook.Slack, slackSigner), keeper, opts...),
	}
	return &hookEnv{h: shape.mount(mws, app), app: app, st: cs}
}

func (e *hookEnv) do(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

func TestRequireWebhookRunsEachDeliveryOnce(t *testing.T) {
	for _, shape := range hookShapes {
		t.Run(shape.name, func(t *testing.T) {
			t.Run("a delivery runs once; its redeliveries get the stored response", func(t *testing.T) {
				e := newHookEnv(t, shape, &hookApp{}, nil, nil)
				first := e.do(standardDelivery("msg_1", time.Now(), `{"n":1}`))
				if first.Code != http.StatusCreated || first.Header().Get("Idempotent-Replayed") != "" ||
					first.Body.String() != `{"id":"msg_1","run":1,"got":"{\"n\":1}"}` {
					t.Fatalf("first = %d %v %s", first.Code, first.Header(), first.Body)
				}
				for i := range 10 {
					// A redelivery is signed again, with a later timestamp.
					again := e.do(standardDelivery("msg_1", time.Now().Add(time.Duration(i)*time.Second), `{"n":1}`))
					if again.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() {
						t.Fatalf("redelivery %d = %d %v %s", i, again.Code, again.Header(), again.Body)
					}
				}
				if n := e.app.count("msg_1"); n != 1 {
					t.Fatalf("the app ran %d times, want 1", n)
				}
			})

			t.Run("a 4xx is stored, as the provider's retries would get it anyway", func(t *testing.T) {
				app := &hookApp{answer: func(w http.ResponseWriter, _ *http.Request, _ webhook.Delivery, run int) {
					w.WriteHeader(http.StatusUnprocessableEntity)
					_, _ = fmt.Fprintf(w, "unknown event type (run %d)", run)
				}}
				e := newHookEnv(t, shape, app, nil, nil)
				for i := range 3 {
					w := e.do(standardDelivery("msg_4xx", time.Now(), `{}`))
					if w.Code != http.StatusUnprocessableEntity || w.Body.String() != "unknown event type (run 1)" || (i > 0) != (w.Header().Get("Idempotent-Replayed") == "true") {
						t.Fatalf("delivery %d = %d %v %s", i, w.Code, w.Header(), w.Body)
					}
				}
			})

			t.Run("a 5xx releases the record: the redelivery runs again", func(t *testing.T) {
				app := &hookApp{answer: func(w http.ResponseWriter, _ *http.Request, _ webhook.Delivery, run int) {
					if run == 1 {
						w.WriteHeader(http.StatusServiceUnavailable)
						_, _ = io.WriteString(w, "database down")
						return
					}
					w.WriteHeader(http.StatusOK)
				}}
				e := newHookEnv(t, shape, app, nil, nil)
				if w := e.do(standardDelivery("msg_5xx", time.Now(), `{}`)); w.Code != http.StatusServiceUnavailable || w.Body.String() != "database down" {
					t.Fatalf("first = %d %s; want the app's own 503", w.Code, w.Body)
				}
				if w := e.do(standardDelivery("msg_5xx", time.Now(), `{}`)); w.Code != http.StatusOK || w.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("redelivery = %d %v", w.Code, w.Header())
				}
				if w := e.do(standardDelivery("msg_5xx", time.Now(), `{}`)); w.Code != http.StatusOK || w.Header().Get("Idempotent-Replayed") != "true" {
					t.Fatalf("third = %d %v", w.Code, w.Header())
				}
				if n := e.app.count("msg_5xx"); n != 2 {
					t.Fatalf("the app ran %d times, want 2", n)
				}
			})

			t.Run("a panic releases the record", func(t *testing.T) {
				app := &hookApp{answer: func(w http.ResponseWriter, _ *http.Request, _ webhook.Delivery, run int) {
					if run == 1 {
						panic("boom")
					}
					w.WriteHeader(http.StatusNoContent)
				}}
				e := newHookEnv(t, shape, app, nil, nil, quiet)
				if w := e.do(standardDelivery("msg_panic", time.Now(), `{}`)); w.Code != http.StatusInternalServerError {
					t.Fatalf("first = %d", w.Code)
				}
				if w := e.do(standardDelivery("msg_panic", time.Now(), `{}`)); w.Code != http.StatusNoContent {
					t.Fatalf("redelivery = %d", w.Code)
				}
			})

			t.Run("an abandoned record holds redeliveries off until its lease ends", func(t *testing.T) {
				app := &hookApp{answer: func(w http.ResponseWriter, _ *http.Request, _ webhook.Delivery, _ int) {
					guard.AbandonRecord(w)
					w.WriteHeader(http.StatusGatewayTimeout)
				}}
				e := newHookEnv(t, shape, app, nil, nil, quiet)
				if w := e.do(standardDelivery("msg_unknown", time.Now(), `{}`)); w.Code != http.StatusGatewayTimeout {
					t.Fatalf("first = %d", w.Code)
				}
				w := e.do(standardDelivery("msg_unknown", time.Now(), `{}`))
				if w.Code != http.StatusConflict || problemCode(t, w) != "request_in_progress" || w.Header().Get("Retry-After") == "" {
					t.Fatalf("redelivery = %d %v %s", w.Code, w.Header(), w.Body)
				}
			})

			t.Run("keys are per route: one ID on two routes runs on each", func(t *testing.T) {
				e := newHookEnv(t, shape, &hookApp{}, nil, nil)
				r := standardDelivery("msg_2", time.Now(), `{}`)
				r.URL.Path = "/hooks/other"
				for _, r := range []*http.Request{standardDelivery("msg_2", time.Now(), `{}`), r} {
					if w := e.do(r); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
						t.Fatalf("%s = %d %v", r.URL.Path, w.Code, w.Header())
					}
				}
			})

			t.Run("stripe: keyed by the event's id, whatever the signature", func(t *testing.T) {
				e := newHookEnv(t, shape, &hookApp{}, nil, nil)
				body := `{"id":"evt_1","type":"charge.succeeded"}`
				first := e.do(stripeDelivery(time.Now(), body))
				again := e.do(stripeDelivery(time.Now().Add(time.Minute), body))
				if first.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" || e.app.count("evt_1") != 1 {
					t.Fatalf("first = %d, again = %d %v, runs %d", first.Code, again.Code, again.Header(), e.app.count("evt_1"))
				}
			})

			t.Run("github: keyed by X-GitHub-Delivery; a redelivery replays, however old its Date", func(t *testing.T) {
				e := newHookEnv(t, shape, &hookApp{}, nil, nil)
				body := `{"action":"opened","number":7}`
				// Date is a year old: GitHub signs no time, so there is no window.
				first := e.do(githubDelivery("72d3162e-cc78-11e3-81ab-4c9367dc0958", time.Now().AddDate(-1, 0, 0), body))
				if first.Code != http.StatusCreated || first.Header().Get("Idempotent-Replayed") != "" ||
					first.Body.String() != `{"id":"72d3162e-cc78-11e3-81ab-4c9367dc0958","run":1,"got":"{\"action\":\"opened\",\"number\":7}"}` {
					t.Fatalf("first = %d %v %s", first.Code, first.Header(), first.Body)
				}
				// GitHub's redelivery keeps the ID and the signature; the Date is new.
				for _, date := range []time.Time{time.Now(), time.Now().AddDate(0, -1, 0)} {
					again := e.do(githubDelivery("72d3162e-cc78-11e3-81ab-4c9367dc0958", date, body))
					if again.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() {
						t.Fatalf("redelivery dated %v = %d %v %s", date, again.Code, again.Header(), again.Body)
					}
				}
				if n := e.app.count("72d3162e-cc78-11e3-81ab-4c9367dc0958"); n != 1 {
					t.Fatalf("the app ran %d times, want 1", n)
				}
				// Another delivery ID is another delivery, even with the same body.
				if w := e.do(githubDelivery("8e7a5c1a-cc78-11e3-81ab-4c9367dc0958", time.Now(), body)); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("a new delivery ID = %d %v", w.Code, w.Header())
				}
			})

			t.Run("slack: an event's retry, signed anew, gets the stored answer; the app runs once", func(t *testing.T) {
				e := newHookEnv(t, shape, &hookApp{}, nil, nil)
				body := `{"type":"event_callback","event_id":"Ev9UQ52YNA","event":{"type":"app_mention"}}`
				ts := time.Now()
				first := e.do(slackDelivery(ts, body))
				if first.Code != http.StatusCreated || first.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("first = %d %v %s", first.Code, first.Header(), first.Body)
				}
				// Slack's retry: a new timestamp, so a new signature, and X-Slack-Retry-Num.
				r := slackDelivery(ts.Add(time.Minute), body)
				r.Header.Set("X-Slack-Retry-Num", "1")
				r.Header.Set("X-Slack-Retry-Reason", "http_timeout")
				retry := e.do(r)
				if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") != "true" || retry.Body.String() != first.Body.String() {
					t.Fatalf("retry = %d %v %s", retry.Code, retry.Header(), retry.Body)
				}
				if n := e.app.count("event_id=Ev9UQ52YNA"); n != 1 {
					t.Fatalf("the app ran %d times, want 1 (runs %v)", n, e.app.runs)
				}
			})

			t.Run("slack: a slash command is keyed by its signature: the same request replays, a new one runs", func(t *testing.T) {
				e := newHookEnv(t, shape, &hookApp{}, nil, nil)
				ts := time.Now()
				first := e.do(slackDelivery(ts, "command=%2Fdeploy&text=prod"))
				same := e.do(slackDelivery(ts, "command=%2Fdeploy&text=prod"))
				again := e.do(slackDelivery(ts.Add(time.Second), "command=%2Fdeploy&text=prod"))
				if first.Code != http.StatusCreated || same.Header().Get("Idempotent-Replayed") != "true" ||
					again.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("first %d, same %d %v, again %d %v", first.Code, same.Code, same.Header(), again.Code, again.Header())
				}
			})

			t.Run("a response over the cap: redeliveries get its status alone", func(t *testing.T) {
				app := &hookApp{answer: func(w http.ResponseWriter, _ *http.Request, _ webhook.Delivery, _ int) {
					w.Header().Set("Content-Length", "64")
					w.WriteHeader(http.StatusOK)
					_, _ = w.Write([]byte(strings.Repeat("x", 64)))
				}}
				e := newHookEnv(t, shape, app, nil, []idempotency.Option{idempotency.WithMaxBody(16)})
				if w := e.do(standardDelivery("msg_big", time.Now(), `{}`)); w.Code != http.StatusOK || w.Body.Len() != 64 {
					t.Fatalf("first = %d, %d bytes", w.Code, w.Body.Len())
				}
				w := e.do(standardDelivery("msg_big", time.Now(), `{}`))
				if w.Code != http.StatusOK || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.Len() != 0 || w.Header().Get("Content-Length") != "" {
					t.Fatalf("redelivery = %d %v %q", w.Code, w.Header(), w.Body)
				}
				if n := e.app.count("msg_big"); n != 1 {
					t.Fatalf("the app ran %d times", n)
				}
			})
		})
	}
}

func TestRequireWebhookRefusesBeforeTheStore(t *testing.T) {
	stale := time.Now().Add(-10 * time.Minute)
	tests := []struct {
		name   string
		req    func() *http.Request
		status int
		code   string
	}{
		{"no webhook-signature", func() *http.Request {
			r := standardDelivery("msg_1", time.Now(), `{}`)
			r.Header.Del("webhook-signature")
			return r
		}, 401, "signature_missing"},
		{"no webhook-id", func() *http.Request {
			r := standardDelivery("msg_1", time.Now(), `{}`)
			r.Header.Del("webhook-id")
			return r
		}, 401, "signature_missing"},
		{"a body that is not what was signed", func() *http.Request {
			r := standardDelivery("msg_1", time.Now(), `{"amount":1}`)
			r.Body = io.NopCloser(strings.NewReader(`{"amount":9}`))
			return r
		}, 401, "signature_invalid"},
		{"a signature by another secret", func() *http.Request {
			r := standardDelivery("msg_1", time.Now(), `{}`)
			r.Header.Set("webhook-signature", "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=")
			return r
		}, 401, "signature_invalid"},
		{"a delivery timestamped 10 minutes ago", func() *http.Request { return standardDelivery("msg_1", stale, `{}`) }, 401, "signature_expired"},
		{"github: a signature by another secret", func() *http.Request {
			r := githubDelivery("gh-1", time.Now(), `{}`)
			r.Header.Set("X-Hub-Signature-256", "sha256="+strings.Repeat("ab", sha256.Size))
			return r
		}, 401, "signature_invalid"},
		{"github: a body that is not what was signed", func() *http.Request {
			r := githubDelivery("gh-1", time.Now(), `{"amount":1}`)
			r.Body = io.NopCloser(strings.NewReader(`{"amount":9}`))
			return r
		}, 401, "signature_invalid"},
		{"github: no X-GitHub-Delivery", func() *http.Request {
			r := githubDelivery("gh-1", time.Now(), `{}`)
			r.Header.Del("X-GitHub-Delivery")
			return r
		}, 401, "signature_missing"},
		{"github: no X-Hub-Signature-256", func() *http.Request {
			r := githubDelivery("gh-1", time.Now(), `{}`)
			r.Header.Del("X-Hub-Signature-256")
			return r
		}, 401, "signature_missing"},
		{"a verified Stripe body without an id", func() *http.Request { return stripeDelivery(time.Now(), `{"object":"event"}`) }, 400, "invalid_request"},
		{"a body over the limit", func() *http.Request {
			return standardDelivery("msg_1", time.Now(), `{"pad":"`+strings.Repeat("x", 2048)+`"}`)
		}, 413, "payload_too_large"},
	}
	for _, shape := range hookShapes {
		for _, tc := range tests {
			t.Run(shape.name+": "+tc.name, func(t *testing.T) {
				e := newHookEnv(t, shape, &hookApp{}, nil, nil, guard.WithMaxBody(1024))
				w := e.do(tc.req())
				if w.Code != tc.status || problemCode(t, w) != tc.code {
					t.Fatalf("= %d %s, want %d %s", w.Code, w.Body, tc.status, tc.code)
				}
				if n := e.st.acquires.Load(); n != 0 {
					t.Errorf("the store was asked %d times", n)
				}
				if len(e.app.runs) != 0 {
					t.Errorf("the app ran: %v", e.app.runs)
				}
				if tc.code == "signature_expired" {
					var p problem.Problem
					_ = json.Unmarshal(w.Body.Bytes(), &p)
					if st, err := time.Parse(time.RFC3339, p.ServerTime); err != nil || time.Since(st) > time.Minute || !strings.HasSuffix(p.ServerTime, "Z") {
						t.Errorf("server_time = %q, want the server's time in UTC", p.ServerTime)
					}
				}
			})
		}
	}
}

func TestRequireWebhookStoreDown(t *testing.T) {
	for _, shape := range hookShapes {
		t.Run(shape.name, func(t *testing.T) {
			e := newHookEnv(t, shape, &hookApp{}, failingStore{err: errors.New("dial tcp 10.0.0.9:6379: refused")}, nil)
			w := e.do(standardDelivery("msg_1", time.Now(), `{}`))
			if w.Code != http.StatusServiceUnavailable || problemCode(t, w) != "store_unavailable" || strings.Contains(w.Body.String(), "10.0.0.9") {
				t.Fatalf("= %d %s", w.Code, w.Body)
			}
			if len(e.app.runs) != 0 {
				t.Fatal("the app ran without a record")
			}
		})
	}
}

// TestRequireWebhookConcurrentCopies: 20 copies of one delivery at once
// run the app once; while it runs, every other copy is answered 409
// request_in_progress with Retry-After. The app holds its run until the
// 19 others were answered, so none of them can arrive after it completes.
func TestRequireWebhookConcurrentCopies(t *testing.T) {
	for _, shape := range hookShapes {
		t.Run(shape.name, func(t *testing.T) {
			release := make(chan struct{})
			app := &hookApp{answer: func(w http.ResponseWriter, _ *http.Request, _ webhook.Delivery, _ int) {
				<-release
				w.WriteHeader(http.StatusAccepted)
			}}
			e := newHookEnv(t, shape, app, nil, nil)
			const copies = 20
			answers := make(chan *httptest.ResponseRecorder, copies)
			var wg sync.WaitGroup
			ts := time.Now()
			for range copies {
				wg.Go(func() { answers <- e.do(standardDelivery("msg_race", ts, `{"n":1}`)) })
			}
			var conflicts int
			timeout := time.After(30 * time.Second)
			for conflicts < copies-1 {
				select {
				case w := <-answers:
					if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
						close(release)
						wg.Wait()
						t.Fatalf("a copy got %d %v %s while the first ran", w.Code, w.Header(), w.Body)
					}
					conflicts++
				case <-timeout:
					close(release)
					wg.Wait()
					t.Fatalf("only %d copies were answered", conflicts)
				}
			}
			close(release)
			wg.Wait()
			if w := <-answers; w.Code != http.StatusAccepted {
				t.Fatalf("the first = %d", w.Code)
			}
			if n := app.count("msg_race"); n != 1 {
				t.Fatalf("the app ran %d times", n)
			}
		})
	}
}

func TestRequireWebhookKeepsRecordsForTheWindow(t *testing.T) {
	tests := []struct {
		name      string
		retention time.Duration
		window    time.Duration
		want      time.Duration
	}{
		{"a retention shorter than twice the window is lengthened", time.Minute, 5 * time.Minute, 10*time.Minute + time.Second},
		{"a longer retention stays", 24 * time.Hour, 5 * time.Minute, 24 * time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := newCountingStore(t)
			v, err := webhook.New(webhook.Standard, []string{hookSecret}, webhook.WithWindow(tc.window))
			if err != nil {
				t.Fatal(err)
			}
			h := guard.RequireWebhook(v, idempotency.New(st, idempotency.WithRetention(tc.retention)))(&hookApp{})
			w := httptest.NewRecorder()
			h.ServeHTTP(w, standardDelivery("msg_1", time.Now(), `{}`))
			if w.Code != http.StatusCreated {
				t.Fatalf("= %d", w.Code)
			}
			if got := time.Duration(st.retention.Load()); got != tc.want {
				t.Fatalf("retention = %v, want %v", got, tc.want)
			}
		})
	}
}
