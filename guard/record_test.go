package guard_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/store"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/token"
)

// tokenRecordStores are the stores the record-mode tests run on: memory
// and miniredis always, the real servers of recordStores when configured.
var tokenRecordStores = append([]struct {
	name string
	open func(t testing.TB) store.Store
}{
	{"miniredis", func(t testing.TB) store.Store {
		mr := miniredis.RunT(t)
		s := redisstore.New(goredis.NewClient(&goredis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, ReadTimeout: -1, WriteTimeout: -1}), redisstore.WithTimeout(10*time.Second))
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
}, recordStores...)

// checkoutApp is the protected form handler: it counts its runs and by
// default places order number run, answering 303 to its page.
type checkoutApp struct {
	runs   atomic.Int32
	handle func(w http.ResponseWriter, r *http.Request, run int32)
}

func (a *checkoutApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.runs.Add(1)
	if a.handle != nil {
		a.handle(w, r, n)
		return
	}
	placeOrder(w, r, n)
}

// placeOrder answers 303 to /orders/<run>, with a cookie and a body naming
// the token's ID (from TokenFrom) and the item the form sent.
func placeOrder(w http.ResponseWriter, r *http.Request, run int32) {
	claims, ok := guard.TokenFrom(r.Context())
	if !ok || claims.ID == "" {
		http.Error(w, "no claims in the context", http.StatusInternalServerError)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: "flash", Value: "order-placed"})
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", run))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusSeeOther)
	_, _ = fmt.Fprintf(w, "order %d for token %s: %s", run, claims.ID, r.PostFormValue("item"))
}

// guardShapes mount POST /checkout behind mw (RequireToken for purpose
// "checkout"), in either middleware shape.
var guardShapes = []struct {
	name  string
	mount func(mw func(http.Handler) http.Handler, app http.Handler) http.Handler
}{
	{"net/http", func(mw func(http.Handler) http.Handler, app http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("POST /checkout", mw(app))
		return mux
	}},
	{"gin", func(mw func(http.Handler) http.Handler, app http.Handler) http.Handler {
		r := gin.New()
		r.POST("/checkout", guard.Gin(mw), func(c *gin.Context) {
			if claims, ok := guard.TokenFrom(c.Request.Context()); !ok || claims.ID == "" {
				c.String(http.StatusInternalServerError, "no claims in the gin request")
				return
			}
			app.ServeHTTP(c.Writer, c.Request)
		})
		return r
	}},
}

// submit posts the checkout form with tok, in the form field or (header)
// in the Idempotency-Token header.
func submit(h http.Handler, tok string, header bool) *httptest.ResponseRecorder {
	form := url.Values{"item": {"book"}}
	if !header && tok != "" {
		form.Set(token.FormField, tok)
	}
	r := httptest.NewRequest(http.MethodPost, "/checkout", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if header {
		r.Header.Set(token.Header, tok)
	}
	return serve(h, r)
}

func TestRequireTokenRecords(t *testing.T) {
	ctx := context.Background()
	status := func(codes map[int32]int) func(http.ResponseWriter, *http.Request, int32) {
		return func(w http.ResponseWriter, r *http.Request, run int32) {
			if code, ok := codes[run]; ok {
				w.WriteHeader(code)
				_, _ = fmt.Fprintf(w, "run %d", run)
				return
			}
			placeOrder(w, r, run)
		}
	}
	// A step submits the token named tok: "a" and "b" are issued for
	// checkout, "login" for another purpose, "used" is redeemed before the
	// steps run, "forged" is no token at all and "" sends none.
	type step struct {
		name         string
		tok          string
		header       bool
		wantStatus   int
		wantCode     string
		wantReplayed bool
		wantRuns     int32
		wantBody     string
		wantLocation string
	}
	tests := []struct {
		name   string
		keeper []idempotency.Option
		handle func(http.ResponseWriter, *http.Request, int32)
		steps  []step
	}{
		{name: "a duplicate submit gets the same 303 to the same order page", steps: []step{
			{"first submit", "a", false, 303, "", false, 1, "order 1", "/orders/1"},
			{"double submit", "a", false, 303, "", true, 1, "order 1", "/orders/1"},
			{"the token in the header is the same token", "a", true, 303, "", true, 1, "order 1", "/orders/1"},
			{"another token places another order", "b", false, 303, "", false, 2, "order 2", "/orders/2"},
			{"whose duplicate gets its own page", "b", true, 303, "", true, 2, "order 2", "/orders/2"},
			{"the first still gets its own", "a", false, 303, "", true, 2, "order 1", "/orders/1"},
		}},
		{name: "a 5xx gives the token back for a retry", handle: status(map[int32]int{1: 503}), steps: []step{
			{"first fails", "a", false, 503, "", false, 1, "run 1", ""},
			{"the retry runs", "a", false, 303, "", false, 2, "order 2", "/orders/2"},
			{"and is recorded", "a", false, 303, "", true, 2, "order 2", "/orders/2"},
		}},
		{name: "a 4xx is recorded", handle: status(map[int32]int{1: 422}), steps: []step{
			{"first", "a", false, 422, "", false, 1, "run 1", ""},
			{"duplicate", "a", false, 422, "", true, 1, "run 1", ""},
		}},
		{name: "a response over the cap is recorded without its body", keeper: []idempotency.Option{idempotency.WithMaxBody(16)}, steps: []step{
			{"first gets it all", "a", false, 303, "", false, 1, "order 1 for token", "/orders/1"},
			{"duplicate", "a", false, 409, "response_not_stored", false, 1, "", ""},
		}},
		{name: "refusals are the token's own and run nothing", steps: []step{
			{"another purpose", "login", false, 403, "purpose_mismatch", false, 0, "", ""},
			{"a forged token", "forged", false, 401, "token_invalid", false, 0, "", ""},
			{"no token", "", false, 400, "invalid_request", false, 0, "", ""},
			{"a token redeemed without a record", "used", false, 409, "token_used", false, 0, "", ""},
			{"a good token still runs", "a", false, 303, "", false, 1, "order 1", "/orders/1"},
		}},
	}
	for _, sc := range tokenRecordStores {
		for _, sh := range guardShapes {
			for _, tc := range tests {
				t.Run(sc.name+"/"+sh.name+"/"+tc.name, func(t *testing.T) {
					st := sc.open(t)
					svc := newTokenService(t, st)
					k := idempotency.New(st, tc.keeper...)
					app := &checkoutApp{handle: tc.handle}
					h := sh.mount(guard.RequireToken(svc, "checkout", guard.WithRecords(k), quiet), app)
					toks := map[string]string{"forged": "a.b.c", "": ""}
					for name, purpose := range map[string]string{"a": "checkout", "b": "checkout", "login": "login", "used": "checkout"} {
						is, err := svc.Issue(ctx, token.IssueRequest{Purpose: purpose})
						if err != nil {
							t.Fatal(err)
						}
						toks[name] = is.Token
					}
					if _, err := svc.Redeem(ctx, toks["used"], "checkout", ""); err != nil {
						t.Fatal(err)
					}
					for _, s := range tc.steps {
						w := submit(h, toks[s.tok], s.header)
						replayed := w.Header().Get(idempotency.ReplayedHeader) == "true"
						if w.Code != s.wantStatus || codeOf(w) != s.wantCode || replayed != s.wantReplayed || app.runs.Load() != s.wantRuns ||
							!strings.Contains(w.Body.String(), s.wantBody) || w.Header().Get("Location") != s.wantLocation {
							t.Fatalf("%s: got %d %q replayed=%v runs=%d Location %q body %q; want %d %q replayed=%v runs=%d Location %q body containing %q",
								s.name, w.Code, codeOf(w), replayed, app.runs.Load(), w.Header().Get("Location"), w.Body,
								s.wantStatus, s.wantCode, s.wantReplayed, s.wantRuns, s.wantLocation, s.wantBody)
						}
						if replayed && w.Header().Get("Set-Cookie") != "" {
							t.Fatalf("%s: the first caller's cookie was replayed: %v", s.name, w.Header())
						}
					}
				})
			}
		}
	}
}

func TestRequireTokenRecordsFiftyConcurrentSubmitsRunOnce(t *testing.T) {
	const n = 50
	for _, sc := range tokenRecordStores {
		for _, sh := range guardShapes {
			t.Run(sc.name+"/"+sh.name, func(t *testing.T) {
				st := sc.open(t)
				svc := newTokenService(t, st)
				hold := make(chan struct{})
				app := &checkoutApp{handle: func(w http.ResponseWriter, r *http.Request, run int32) {
					<-hold // until every duplicate has answered
					placeOrder(w, r, run)
				}}
				h := sh.mount(guard.RequireToken(svc, "checkout", guard.WithRecords(idempotency.New(st)), quiet), app)
				is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
				if err != nil {
					t.Fatal(err)
				}
				got := sendHeld(n, hold, func(i int) *httptest.ResponseRecorder { return submit(h, is.Token, i%2 == 0) })
				wantOneRun(t, got, 303, app.runs.Load())
				if w := submit(h, is.Token, false); w.Code != 303 || w.Header().Get(idempotency.ReplayedHeader) != "true" || w.Header().Get("Location") != "/orders/1" {
					t.Fatalf("after completion: %d %v", w.Code, w.Header())
				}
			})
		}
	}
}

func TestRequireTokenRecordsPanicGivesTheTokenBack(t *testing.T) {
	for _, sh := range guardShapes {
		t.Run(sh.name, func(t *testing.T) {
			st := newRecordStore(t, nil)
			svc := newTokenService(t, st)
			app := &checkoutApp{handle: func(w http.ResponseWriter, r *http.Request, run int32) {
				if run == 1 {
					w.Header().Set("X-Half", "written")
					panic("the order service blew up")
				}
				placeOrder(w, r, run)
			}}
			h := sh.mount(guard.RequireToken(svc, "checkout", guard.WithRecords(idempotency.New(st)), quiet), app)
			is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
			if err != nil {
				t.Fatal(err)
			}
			if w := submit(h, is.Token, false); w.Code != 500 || codeOf(w) != "internal_error" || w.Header().Get("X-Half") != "" {
				t.Fatalf("the panic: %d %q %v", w.Code, codeOf(w), w.Header())
			}
			if w := submit(h, is.Token, false); w.Code != 303 || w.Header().Get("Location") != "/orders/2" || w.Header().Get(idempotency.ReplayedHeader) != "" {
				t.Fatalf("the retry: %d %v", w.Code, w.Header())
			}
			if w := submit(h, is.Token, false); w.Code != 303 || w.Header().Get("Location") != "/orders/2" || w.Header().Get(idempotency.ReplayedHeader) != "true" {
				t.Fatalf("the duplicate: %d %v", w.Code, w.Header())
			}
		})
	}
}

// TestRequireTokenRecordsReplayIsByteIdentical submits over real HTTP and
// compares the replay with the first answer byte for byte, headers
// included (less the ones never replayed).
func TestRequireTokenRecordsReplayIsByteIdentical(t *testing.T) {
	st := newRecordStore(t, nil)
	svc := newTokenService(t, st)
	app := &checkoutApp{handle: func(w http.ResponseWriter, r *http.Request, run int32) {
		w.Header()["X-Multi"] = []string{"a", "b"}
		w.Header().Set("Cache-Control", "no-store")
		placeOrder(w, r, run)
	}}
	srv := httptest.NewServer(guard.RequireToken(svc, "checkout", guard.WithRecords(idempotency.New(st)), quiet)(app))
	defer srv.Close()
	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		t.Fatal(err)
	}
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	do := func() (*http.Response, []byte) {
		form := url.Values{token.FormField: {is.Token}, "item": {"book"}}
		resp, err := client.PostForm(srv.URL+"/checkout", form)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	first, firstBody := do()
	second, secondBody := do()
	if first.StatusCode != 303 || second.StatusCode != 303 || !bytes.Equal(firstBody, secondBody) {
		t.Fatalf("first %d %q, replay %d %q", first.StatusCode, firstBody, second.StatusCode, secondBody)
	}
	if first.Header.Get(idempotency.ReplayedHeader) != "" || second.Header.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("Idempotent-Replayed: first %q, replay %q", first.Header.Get(idempotency.ReplayedHeader), second.Header.Get(idempotency.ReplayedHeader))
	}
	if first.Header.Get("Set-Cookie") == "" || second.Header.Get("Set-Cookie") != "" {
		t.Fatalf("Set-Cookie: first %q, replay %q; want it on the first only", first.Header.Get("Set-Cookie"), second.Header.Get("Set-Cookie"))
	}
	strip := func(h http.Header) string {
		h = h.Clone()
		for _, name := range []string{"Date", "Set-Cookie", idempotency.ReplayedHeader} {
			h.Del(name)
		}
		return fmt.Sprint(h)
	}
	if a, b := strip(first.Header), strip(second.Header); a != b {
		t.Fatalf("headers differ:\nfirst  %s\nreplay %s", a, b)
	}
	if len(second.Header["X-Multi"]) != 2 || second.Header.Get("Location") != "/orders/1" {
		t.Fatalf("replayed headers lost something: %v", second.Header)
	}
}

// recordRedeemFailure fails every redemption that would open a record
// (one with an owner), as an unreachable store; plain redemptions work.
type recordRedeemFailure struct {
	store.Store
	err error
}

func (f recordRedeemFailure) Redeem(ctx context.Context, id string, want store.Token, owner string, lease time.Duration) (store.RedeemResult, store.Record, error) {
	if owner != "" {
		return 0, store.Record{}, store.Unavailable("redeem", f.err)
	}
	return f.Store.Redeem(ctx, id, want, owner, lease)
}

func TestRequireTokenRecordsStoreFailure(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantCode   string
	}{
		{"an unreachable store answers 503 and runs nothing", errors.New("dial tcp 10.0.0.7:6379: connection refused"), 503, "store_unavailable"},
		{"a full store answers 503 store_full", store.ErrFull, 503, "store_full"},
	}
	for _, sh := range guardShapes {
		for _, tc := range tests {
			t.Run(sh.name+"/"+tc.name, func(t *testing.T) {
				mem := newRecordStore(t, nil)
				// The token and its record share a store, so the failure
				// is the token service's store's.
				st := recordRedeemFailure{mem, tc.err}
				svc := newTokenService(t, st)
				app := &checkoutApp{}
				h := sh.mount(guard.RequireToken(svc, "checkout", guard.WithRecords(idempotency.New(st)), quiet), app)
				is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
				if err != nil {
					t.Fatal(err)
				}
				w := submit(h, is.Token, false)
				if w.Code != tc.wantStatus || codeOf(w) != tc.wantCode || app.runs.Load() != 0 || w.Header().Get("Retry-After") == "" || strings.Contains(w.Body.String(), "10.0.0.7") {
					t.Fatalf("got %d %q runs=%d %v %s", w.Code, codeOf(w), app.runs.Load(), w.Header(), w.Body)
				}
				if _, err := svc.Redeem(context.Background(), is.Token, "checkout", ""); err != nil {
					t.Fatalf("the token was spent: %v", err)
				}
			})
		}
	}
}

func TestRequireTokenRecordsMetrics(t *testing.T) {
	st := newRecordStore(t, nil)
	svc := newTokenService(t, st)
	m := metrics.New()
	h := guard.RequireToken(svc, "checkout", guard.WithRecords(idempotency.New(st)), guard.WithMetrics(m), quiet)(&checkoutApp{})
	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		t.Fatal(err)
	}
	submit(h, is.Token, false)
	submit(h, is.Token, false)
	submit(h, "a.b.c", false)
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "replayguard_redemptions_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			got[mt.GetLabel()[0].GetValue()] = mt.GetCounter().GetValue()
		}
	}
	if want := map[string]float64{"redeemed": 1, "replayed": 1, "token_invalid": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("redemption outcomes = %v, want %v", got, want)
	}
}

// TestRequireTokenRecordsAfterExpiry checks that a duplicate that arrives
// after the token's exp still gets the recorded response, while an
// expired token without a record is refused and never runs the handler.
func TestRequireTokenRecordsAfterExpiry(t *testing.T) {
	for _, sh := range guardShapes {
		t.Run(sh.name, func(t *testing.T) {
			clk := newFakeClock()
			st := newRecordStore(t, clk)
			svc := newTokenService(t, st, token.WithClock(clk.Now))
			app := &checkoutApp{}
			h := sh.mount(guard.RequireToken(svc, "checkout", guard.WithRecords(idempotency.New(st, idempotency.WithClock(clk.Now))), quiet), app)
			issue := func() string {
				is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout", TTL: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				return is.Token
			}
			used, unused := issue(), issue()
			if w := submit(h, used, false); w.Code != 303 || w.Header().Get("Location") != "/orders/1" {
				t.Fatalf("first: %d %v", w.Code, w.Header())
			}
			clk.Advance(time.Minute) // past exp and the leeway
			if w := submit(h, used, false); w.Code != 303 || w.Header().Get("Location") != "/orders/1" || w.Header().Get(idempotency.ReplayedHeader) != "true" {
				t.Fatalf("a late duplicate: %d %q %v", w.Code, codeOf(w), w.Header())
			}
			if w := submit(h, unused, false); w.Code != 401 || codeOf(w) != "token_expired" || app.runs.Load() != 1 {
				t.Fatalf("an expired token: %d %q, runs %d", w.Code, codeOf(w), app.runs.Load())
			}
		})
	}
}
