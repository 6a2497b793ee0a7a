package guard_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// clientKey is a client's key pair as the test signs with it; key() is
// the server's side of it.
type clientKey struct {
	id     string
	alg    string
	secret []byte
	priv   ed25519.PrivateKey
}

func (k clientKey) key() replay.Key {
	rk := replay.Key{ID: k.id, Alg: k.alg, Secret: k.secret, Label: "label of " + k.id}
	if k.priv != nil {
		rk.PublicKey = k.priv.Public().(ed25519.PublicKey)
	}
	return rk
}

func hmacKey(t testing.TB, id string) clientKey {
	t.Helper()
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	return clientKey{id: id, alg: replay.AlgHMACSHA256, secret: secret}
}

func ed25519Key(t testing.TB, id string) clientKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return clientKey{id: id, alg: replay.AlgEd25519, priv: priv}
}

func keysOf(t testing.TB, ks ...clientKey) *replay.Keys {
	t.Helper()
	var rks []replay.Key
	for _, k := range ks {
		rks = append(rks, k.key())
	}
	keys, err := replay.NewKeys(rks...)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// signing says how signRequest signs; zero values mean: the required
// components (plus content-digest with a body), created now, a random
// nonce.
type signing struct {
	components []string
	created    time.Time
	nonce      string
}

// signRequest signs req (whose URL is the target URI the client calls)
// with k as a client does: Content-Digest for a body, then
// Signature-Input and Signature labelled sig1. The body is read and put
// back.
func signRequest(t testing.TB, req *http.Request, k clientKey, s signing) {
	t.Helper()
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			t.Fatal(err)
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	comps := s.components
	if comps == nil {
		comps = append([]string(nil), replay.DefaultRequired...)
		if len(body) > 0 {
			comps = append(comps, "content-digest")
		}
	}
	if len(body) > 0 && req.Header.Get("Content-Digest") == "" {
		req.Header.Set("Content-Digest", replay.ContentDigest(body))
	}
	if s.created.IsZero() {
		s.created = time.Now()
	}
	if s.nonce == "" {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		s.nonce = base64.RawURLEncoding.EncodeToString(b)
	}
	il := httpsfv.InnerList{Params: httpsfv.NewParams()}
	for _, c := range comps {
		il.Items = append(il.Items, httpsfv.NewItem(c))
	}
	il.Params.Add("created", s.created.Unix())
	il.Params.Add("nonce", s.nonce)
	il.Params.Add("keyid", k.id)
	il.Params.Add("alg", k.alg)
	u := *req.URL
	if u.Host == "" {
		u.Host = req.Host
	}
	base, err := replay.SignatureBase(replay.Message{Method: req.Method, URL: &u, Header: req.Header, Body: body}, "sig1", il)
	if err != nil {
		t.Fatal(err)
	}
	var sig []byte
	switch k.alg {
	case replay.AlgHMACSHA256:
		mac := hmac.New(sha256.New, k.secret)
		mac.Write([]byte(base))
		sig = mac.Sum(nil)
	case replay.AlgEd25519:
		sig = ed25519.Sign(k.priv, []byte(base))
	}
	input := httpsfv.NewDictionary()
	input.Add("sig1", il)
	in, err := httpsfv.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Signature-Input", in)
	req.Header.Set("Signature", "sig1=:"+base64.StdEncoding.EncodeToString(sig)+":")
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// failingNonces is a store whose nonce records fail, like a Redis that is
// down.
type failingNonces struct{ *memory.Store }

func (f failingNonces) Put(ctx context.Context, key string, t store.Token, ttl time.Duration) (bool, error) {
	if store.IsNonceKey(key) {
		return false, store.Unavailable("put", errors.New("dial tcp 10.9.8.7:6379: connect: connection refused"))
	}
	return f.Store.Put(ctx, key, t, ttl)
}

var _ store.Store = failingNonces{}

// signatureShape builds the same protected route, POST /orders, behind mw
// (RequireSignature) with either middleware shape. The handler answers 201
// with the key ID from the context and the body it read, and counts its
// runs.
type signatureShape struct {
	name  string
	build func(mw func(http.Handler) http.Handler, runs *atomic.Int64) http.Handler
}

var signatureShapes = []signatureShape{
	{"gin", func(mw func(http.Handler) http.Handler, runs *atomic.Int64) http.Handler {
		r := gin.New()
		r.POST("/orders", guard.Gin(mw), func(c *gin.Context) {
			res, ok := guard.SignatureFrom(c.Request.Context())
			if !ok || res.KeyID == "" {
				c.String(http.StatusInternalServerError, "no signature in context")
				return
			}
			body, _ := io.ReadAll(c.Request.Body)
			runs.Add(1)
			c.String(http.StatusCreated, res.KeyID+" "+string(body))
		})
		return r
	}},
	{"net/http", func(mw func(http.Handler) http.Handler, runs *atomic.Int64) http.Handler {
		return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			res, ok := guard.SignatureFrom(r.Context())
			if !ok || res.KeyID == "" {
				http.Error(w, "no signature in context", http.StatusInternalServerError)
				return
			}
			body, _ := io.ReadAll(r.Body)
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, res.KeyID+" "+string(body))
		}))
	}},
}

// orderRequest is POST http://api.example/orders with body, as the server
// sees it.
func orderRequest(body string) *http.Request {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(http.MethodPost, "http://api.example/orders", r)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// signatureProblem requires rec to be a problem with status and code and
// returns it.
func signatureProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) problem.Problem {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d %s: %s", rec.Code, status, code, rec.Body)
	}
	if got := problemCode(t, rec); got != code {
		t.Fatalf("code %q, want %q: %s", got, code, rec.Body)
	}
	var p problem.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRequireSignature(t *testing.T) {
	partner := hmacKey(t, "partner-1")
	mobile := ed25519Key(t, "mobile")
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }

	type env struct {
		h    http.Handler
		runs *atomic.Int64
	}
	tests := []struct {
		name  string
		store func() store.Store
		run   func(t *testing.T, e env)
	}{
		{"a signed request runs the handler once with the key ID and the whole body; its replay is replayed_request", nil, func(t *testing.T, e env) {
			req := orderRequest(`{"item":"book"}`)
			signRequest(t, req, partner, signing{created: now})
			replayed := req.Clone(context.Background())
			replayed.Body = io.NopCloser(strings.NewReader(`{"item":"book"}`))
			if rec := serve(e.h, req); rec.Code != http.StatusCreated || rec.Body.String() != `partner-1 {"item":"book"}` {
				t.Fatalf("first = %d %s", rec.Code, rec.Body)
			}
			rec := serve(e.h, replayed)
			signatureProblem(t, rec, http.StatusUnauthorized, "replayed_request")
			if got := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(got, "Signature") {
				t.Errorf("WWW-Authenticate = %q, want Signature", got)
			}
			if e.runs.Load() != 1 {
				t.Fatalf("handler ran %d times", e.runs.Load())
			}
		}},
		{"an ed25519 signature without a body is accepted", nil, func(t *testing.T, e env) {
			req := orderRequest("")
			signRequest(t, req, mobile, signing{created: now})
			if rec := serve(e.h, req); rec.Code != http.StatusCreated || rec.Body.String() != "mobile " {
				t.Fatalf("= %d %s", rec.Code, rec.Body)
			}
		}},
		{"an unsigned request is signature_missing and the handler never runs", nil, func(t *testing.T, e env) {
			signatureProblem(t, serve(e.h, orderRequest(`{}`)), http.StatusUnauthorized, "signature_missing")
			if e.runs.Load() != 0 {
				t.Fatal("the handler ran")
			}
		}},
		{"a signature from outside the window is signature_expired with the server's time", nil, func(t *testing.T, e env) {
			req := orderRequest(`{}`)
			signRequest(t, req, partner, signing{created: now.Add(-replay.DefaultWindow - time.Minute)})
			p := signatureProblem(t, serve(e.h, req), http.StatusUnauthorized, "signature_expired")
			if p.ServerTime != "2026-11-22T10:00:00Z" {
				t.Errorf("server_time = %q, want 2026-11-22T10:00:00Z", p.ServerTime)
			}
			if !strings.HasPrefix(p.Detail, "created ") {
				t.Errorf("detail = %q, want the reason", p.Detail)
			}
		}},
		{"a body changed after signing is signature_invalid", nil, func(t *testing.T, e env) {
			req := orderRequest(`{"item":"book"}`)
			signRequest(t, req, partner, signing{created: now})
			req.Body = io.NopCloser(strings.NewReader(`{"item":"car!"}`))
			signatureProblem(t, serve(e.h, req), http.StatusUnauthorized, "signature_invalid")
		}},
		{"a nonce the store cannot record is 503 store_unavailable without internals", func() store.Store { return failingNonces{memory.New()} }, func(t *testing.T, e env) {
			req := orderRequest(`{}`)
			signRequest(t, req, partner, signing{created: now})
			rec := serve(e.h, req)
			signatureProblem(t, rec, http.StatusServiceUnavailable, "store_unavailable")
			if strings.Contains(rec.Body.String(), "10.9.8.7") || e.runs.Load() != 0 {
				t.Fatalf("= %s, runs %d", rec.Body, e.runs.Load())
			}
		}},
		{"a body over the bound is 413 payload_too_large", nil, func(t *testing.T, e env) {
			req := orderRequest(strings.Repeat("x", guard.DefaultMaxBody+1))
			signRequest(t, req, partner, signing{created: now})
			signatureProblem(t, serve(e.h, req), http.StatusRequestEntityTooLarge, "payload_too_large")
		}},
		{"a body of unknown length over the bound is 413 payload_too_large", nil, func(t *testing.T, e env) {
			req := orderRequest("")
			signRequest(t, req, partner, signing{created: now})
			req.Body = io.NopCloser(strings.NewReader(strings.Repeat("x", guard.DefaultMaxBody+1)))
			req.ContentLength = -1
			signatureProblem(t, serve(e.h, req), http.StatusRequestEntityTooLarge, "payload_too_large")
		}},
		{"an unsigned request is refused before its body is read", nil, func(t *testing.T, e env) {
			req := orderRequest("")
			body := &countingReader{r: strings.NewReader(strings.Repeat("x", guard.DefaultMaxBody+1))}
			req.Body, req.ContentLength = io.NopCloser(body), -1
			signatureProblem(t, serve(e.h, req), http.StatusUnauthorized, "signature_missing")
			if body.n != 0 {
				t.Fatalf("%d bytes of the body were read", body.n)
			}
		}},
		{"a body of exactly the bound is verified and handed on whole", nil, func(t *testing.T, e env) {
			body := strings.Repeat("y", guard.DefaultMaxBody)
			req := orderRequest(body)
			signRequest(t, req, partner, signing{created: now})
			if rec := serve(e.h, req); rec.Code != http.StatusCreated || rec.Body.Len() != len("partner-1 ")+len(body) {
				t.Fatalf("= %d, %d bytes", rec.Code, rec.Body.Len())
			}
		}},
	}
	for _, sh := range signatureShapes {
		t.Run(sh.name, func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					var st store.Store = memory.New()
					if tc.store != nil {
						st = tc.store()
					}
					t.Cleanup(func() { _ = st.Close() })
					v := replay.NewVerifier(keysOf(t, partner, mobile), st, replay.WithClock(clock))
					var runs atomic.Int64
					tc.run(t, env{h: sh.build(guard.RequireSignature(v), &runs), runs: &runs})
				})
			}
		})
	}
}

func TestRequireSignatureTargetURI(t *testing.T) {
	partner := hmacKey(t, "partner-1")
	// The default components leave the scheme out; @target-uri covers it.
	withScheme := []string{"@method", "@authority", "@path", "@target-uri"}
	tests := []struct {
		name string
		opts []guard.Option
		// signed is the URI the client signs, with components; served
		// how the request reaches the application.
		signed     string
		components []string
		served     string
		want       int
	}{
		{"plain HTTP request signed for http", nil, "http://api.example/orders?id=7", withScheme, "http://api.example/orders?id=7", http.StatusCreated},
		{"TLS request signed for https", nil, "https://api.example/orders?id=7", withScheme, "https://api.example/orders?id=7", http.StatusCreated},
		{"behind a TLS proxy without WithScheme an https signature fails", nil, "https://api.example/orders", withScheme, "http://api.example/orders", http.StatusUnauthorized},
		{"behind a TLS proxy WithScheme(https) verifies", []guard.Option{guard.WithScheme("https")}, "https://api.example/orders", withScheme, "http://api.example/orders", http.StatusCreated},
		{"a signature that does not cover the scheme verifies on either", nil, "https://api.example/orders", nil, "http://api.example/orders", http.StatusCreated},
		{"a proxy rewriting Host needs WithAuthority", []guard.Option{guard.WithScheme("https"), guard.WithAuthority("api.example")}, "https://api.example/orders", withScheme, "http://10.0.0.5:8080/orders", http.StatusCreated},
		{"a rewritten Host without WithAuthority fails", []guard.Option{guard.WithScheme("https")}, "https://api.example/orders", nil, "http://10.0.0.5:8080/orders", http.StatusUnauthorized},
		{"the default port is the same authority", nil, "https://api.example:443/orders", nil, "https://api.example/orders", http.StatusCreated},
		{"a different query fails", nil, "http://api.example/orders?id=7", nil, "http://api.example/orders?id=8", http.StatusUnauthorized},
		{"a different path fails", nil, "http://api.example/orders", nil, "http://api.example/orders/", http.StatusUnauthorized},
		{"a percent-encoded path is checked as sent", nil, "http://api.example/orders/a%2Fb", nil, "http://api.example/orders/a%2Fb", http.StatusCreated},
	}
	for _, sh := range signatureShapes {
		for _, tc := range tests {
			t.Run(sh.name+"/"+tc.name, func(t *testing.T) {
				st := memory.New()
				t.Cleanup(func() { _ = st.Close() })
				mw := guard.RequireSignature(replay.NewVerifier(keysOf(t, partner), st), tc.opts...)
				var h http.Handler
				if sh.name == "gin" {
					r := gin.New() // every path, so the path cases reach the middleware
					r.Use(guard.Gin(mw))
					r.NoRoute(func(c *gin.Context) { c.Status(http.StatusCreated) })
					h = r
				} else {
					h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						w.WriteHeader(http.StatusCreated)
					}))
				}
				signed := httptest.NewRequest(http.MethodPost, tc.signed, nil)
				signRequest(t, signed, partner, signing{components: tc.components})
				req := httptest.NewRequest(http.MethodPost, tc.served, nil)
				req.Header = signed.Header.Clone()
				// A client (or proxy) claiming https is not believed.
				req.Header.Set("X-Forwarded-Proto", "https")
				rec := serve(h, req)
				if rec.Code != tc.want {
					t.Fatalf("= %d %s, want %d", rec.Code, rec.Body, tc.want)
				}
			})
		}
	}
}

// The path signed is the one on the request line, even when a router
// strips a prefix from r.URL.Path before the middleware runs.
func TestRequireSignatureUnderStripPrefix(t *testing.T) {
	partner := hmacKey(t, "partner-1")
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	var runs atomic.Int64
	h := signatureShapes[1].build(guard.RequireSignature(replay.NewVerifier(keysOf(t, partner), st)), &runs)
	mux := http.NewServeMux()
	mux.Handle("/api/", http.StripPrefix("/api", h))
	req := httptest.NewRequest(http.MethodPost, "http://api.example/api/orders", strings.NewReader("{}"))
	signRequest(t, req, partner, signing{})
	if rec := serve(mux, req); rec.Code != http.StatusCreated {
		t.Fatalf("= %d %s", rec.Code, rec.Body)
	}
}

func TestRequireSignatureErrorHandlerAndMetrics(t *testing.T) {
	partner := hmacKey(t, "partner-1")
	for _, sh := range signatureShapes {
		t.Run(sh.name, func(t *testing.T) {
			st := memory.New()
			t.Cleanup(func() { _ = st.Close() })
			var reason error
			m := metrics.New()
			mw := guard.RequireSignature(replay.NewVerifier(keysOf(t, partner), st),
				guard.WithMetrics(m),
				guard.WithErrorHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					reason = guard.FailureReason(r)
					w.WriteHeader(problem.For(reason).Status)
					_, _ = io.WriteString(w, "<p>Sign your requests.</p>")
				})))
			var runs atomic.Int64
			h := sh.build(mw, &runs)
			rec := serve(h, orderRequest(""))
			if rec.Code != http.StatusUnauthorized || !errors.Is(reason, replay.ErrMissing) || !strings.Contains(rec.Body.String(), "Sign your") {
				t.Fatalf("= %d %q, reason %v", rec.Code, rec.Body, reason)
			}
			signed := orderRequest(`{}`)
			signRequest(t, signed, partner, signing{})
			if rec := serve(h, signed); rec.Code != http.StatusCreated {
				t.Fatalf("signed = %d %s", rec.Code, rec.Body)
			}
			families, err := m.Registry.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, f := range families {
				if f.GetName() != "replayguard_signature_verifications_total" {
					continue
				}
				for _, mt := range f.GetMetric() {
					got[mt.GetLabel()[0].GetValue()] = mt.GetCounter().GetValue()
				}
			}
			if want := map[string]float64{"signature_missing": 1, "verified": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("verification outcomes = %v, want %v", got, want)
			}
		})
	}
}
