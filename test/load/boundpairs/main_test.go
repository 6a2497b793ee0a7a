package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayguard/replayguard/test/load/internal/fixture"
	"github.com/replayguard/replayguard/token"
)

// members returns the names of a JSON object's members, in order.
func members(t *testing.T, body []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	if tk, err := dec.Token(); err != nil || tk != json.Delim('{') {
		t.Fatalf("body %s is not a JSON object", body)
	}
	var names []string
	for dec.More() {
		tk, err := dec.Token()
		if err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
		names = append(names, tk.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
	}
	return names
}

// tokenOf returns the "token" member of an issue answer.
func tokenOf(t *testing.T, w fixture.Wire) string {
	t.Helper()
	var v struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(w.Body, &v); err != nil || v.Token == "" {
		t.Fatalf("issue answered %d %s: no token", w.Status, w.Body)
	}
	return v.Token
}

// replayguard serves Replayguard's own engine on the memory store, with
// run.sh's key ID.
func replayguard(t *testing.T) *httptest.Server { return fixture.Replayguard(t) }

// TestSameAnswersAsReplayguard runs an issue, a redeem, a second redeem
// and a redeem without a token against Replayguard's own engine and
// against boundpairs over HTTP, and wants of each answer the same status,
// header names, JSON member names (in order) and header values but for
// the Date, the request ID and the length; of the answers whose values
// have the same size (the issue and redeem answers, the used-token
// refusal) the same length; and of the used-token refusal the same body
// but for the request ID.
func TestSameAnswersAsReplayguard(t *testing.T) {
	rg := replayguard(t)
	bp := httptest.NewServer(newRouter(newServer(time.Now, maxLive)))
	t.Cleanup(bp.Close)

	issuedRG, issuedBP := fixture.Post(t, rg.URL, issuePath, ""), fixture.Post(t, bp.URL, issuePath, "")
	tokRG, tokBP := tokenOf(t, issuedRG), tokenOf(t, issuedBP)
	if len(tokRG) != tokenLen || len(tokBP) != tokenLen {
		t.Errorf("token lengths: Replayguard's %d, boundpairs' %d, tokenLen %d: want all equal", len(tokRG), len(tokBP), tokenLen)
	}
	type step struct {
		name       string
		want, got  fixture.Wire
		wantStatus int
		sameLength bool
		sameBody   bool
	}
	// Each step runs after the ones before (calls in a composite literal
	// run in order), on the token each side issued.
	steps := []step{
		{"issue", issuedRG, issuedBP, http.StatusCreated, true, false},
		{"redeem", fixture.Post(t, rg.URL, redeemPath, tokRG), fixture.Post(t, bp.URL, redeemPath, tokBP), http.StatusOK, true, false},
		{"second redeem of the same token", fixture.Post(t, rg.URL, redeemPath, tokRG), fixture.Post(t, bp.URL, redeemPath, tokBP), http.StatusConflict, true, true},
		{"redeem without a token", fixture.Post(t, rg.URL, redeemPath, ""), fixture.Post(t, bp.URL, redeemPath, ""), http.StatusBadRequest, false, false},
	}
	for _, tt := range steps {
		t.Run(tt.name, func(t *testing.T) {
			want, got := tt.want, tt.got
			if want.Status != tt.wantStatus {
				t.Fatalf("Replayguard answered %d %s, want %d", want.Status, want.Body, tt.wantStatus)
			}
			if got.Status != want.Status {
				t.Errorf("status = %d %s, Replayguard's %d", got.Status, got.Body, want.Status)
			}
			id := want.Header.Get("X-Request-Id")
			if len(id) != len(fixedRequestID) || got.Header.Get("X-Request-Id") != fixedRequestID {
				t.Errorf("X-Request-Id = %q, Replayguard's %q: want %q, as long as Replayguard's", got.Header.Get("X-Request-Id"), id, fixedRequestID)
			}
			wh, gh := want.Header.Clone(), got.Header.Clone()
			for _, h := range []http.Header{wh, gh} {
				h.Del("Date")
				h.Del("X-Request-Id")
				if !tt.sameLength {
					h.Del("Content-Length")
				}
			}
			if !maps.EqualFunc(gh, wh, slices.Equal[[]string]) {
				t.Errorf("header fields %v, Replayguard's %v", gh, wh)
			}
			if g, w := slices.Sorted(maps.Keys(got.Header)), slices.Sorted(maps.Keys(want.Header)); !slices.Equal(g, w) {
				t.Errorf("header names %v, Replayguard's %v", g, w)
			}
			if g, w := members(t, got.Body), members(t, want.Body); !slices.Equal(g, w) {
				t.Errorf("JSON members %v, Replayguard's %v", g, w)
			}
			if tt.sameLength && len(got.Body) != len(want.Body) {
				t.Errorf("body\n%s\nis %d bytes, Replayguard's\n%s\n%d", got.Body, len(got.Body), want.Body, len(want.Body))
			}
			if wb := bytes.ReplaceAll(want.Body, []byte(id), []byte(fixedRequestID)); tt.sameBody && !bytes.Equal(got.Body, wb) {
				t.Errorf("body\n%s\nReplayguard's (with its request ID replaced)\n%s", got.Body, wb)
			}
		})
	}
}

// serve sends one POST to h in process.
func serve(h http.Handler, path, tok string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, nil)
	if tok != "" {
		req.Header.Set(token.Header, tok)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// issueToken issues a token from h and returns it.
func issueToken(t *testing.T, h http.Handler) string {
	t.Helper()
	w := serve(h, issuePath, "")
	if w.Code != http.StatusCreated {
		t.Fatalf("issue = %d %s, want 201", w.Code, w.Body)
	}
	return tokenOf(t, fixture.Wire{Status: w.Code, Header: w.Header(), Body: w.Body.Bytes()})
}

// code returns the problem code of a refusal's body.
func code(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}

// TestRedeem issues one token, lets the clock run on by after, then
// redeems what send lists: the token ("issued"), another of the same
// length never issued ("other"), or none ("none").
func TestRedeem(t *testing.T) {
	tests := []struct {
		name  string
		after time.Duration
		send  []string
		want  []string // status and problem code of each redeem
	}{
		{"a token redeems once, then is used", 0, []string{"issued", "issued"}, []string{"200 ", "409 token_used"}},
		{"a token redeems until its 300 s are up", tokenTTL - time.Second, []string{"issued"}, []string{"200 "}},
		{"an expired token is refused as Replayguard refuses it, then is gone", tokenTTL, []string{"issued", "issued"}, []string{"401 token_expired", "409 token_used"}},
		{"a token never issued is absent and takes nothing", 0, []string{"other", "issued"}, []string{"409 token_used", "200 "}},
		{"no token is a bad request", 0, []string{"none"}, []string{"400 invalid_request"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
			h := newRouter(newServer(func() time.Time { return now }, maxLive))
			issued := issueToken(t, h)
			last := byte('A')
			if issued[tokenLen-1] == last {
				last = 'B'
			}
			toks := map[string]string{"issued": issued, "other": issued[:tokenLen-1] + string(last), "none": ""}
			now = now.Add(tt.after)
			var got []string
			for _, which := range tt.send {
				got = append(got, outcome(serve(h, redeemPath, toks[which])))
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("redeems answered %q, want %q", got, tt.want)
			}
		})
	}
}

// outcome is an answer's status and problem code ("200 " for none).
func outcome(w *httptest.ResponseRecorder) string {
	return fmt.Sprintf("%d %s", w.Code, code(w.Body.Bytes()))
}

// TestConcurrentRedeems redeems each of several tokens from 32 goroutines
// at once: exactly one of each token's redeems may answer 200, the others
// 409 token_used.
func TestConcurrentRedeems(t *testing.T) {
	h := newRouter(newServer(time.Now, maxLive))
	const tokens, racers = 20, 32
	for range tokens {
		tok := issueToken(t, h)
		answers := make([]string, racers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range racers {
			wg.Go(func() {
				<-start
				answers[i] = outcome(serve(h, redeemPath, tok))
			})
		}
		close(start)
		wg.Wait()
		slices.Sort(answers)
		want := append([]string{"200 "}, slices.Repeat([]string{"409 token_used"}, racers-1)...)
		if !slices.Equal(answers, want) {
			t.Fatalf("concurrent redeems of one token answered %q, want one 200 and %d 409s", answers, racers-1)
		}
	}
}

// TestFull checks the cap on live tokens: an issue beyond it is refused
// with Replayguard's 503 store_full, and a redeem frees a place.
func TestFull(t *testing.T) {
	h := newRouter(newServer(time.Now, 2))
	first := issueToken(t, h)
	issueToken(t, h)
	w := serve(h, issuePath, "")
	if w.Code != http.StatusServiceUnavailable || code(w.Body.Bytes()) != "store_full" || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("issue beyond the cap = %d %v %s, want 503 store_full with Retry-After: 1", w.Code, w.Header(), w.Body)
	}
	if got := outcome(serve(h, redeemPath, first)); got != "200 " {
		t.Fatalf("redeem = %q, want 200", got)
	}
	issueToken(t, h)
	// A redeem of an absent token frees nothing.
	if got := outcome(serve(h, redeemPath, first)); got != "409 token_used" {
		t.Fatalf("second redeem = %q, want 409 token_used", got)
	}
	if w := serve(h, issuePath, ""); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("issue beyond the cap after a 409 = %d, want 503", w.Code)
	}
}

// TestTokensUniqueAndShaped issues tokens from several goroutines and
// wants each unique, tokenLen base64url characters, with an 18-digit ID
// of its own.
func TestTokensUniqueAndShaped(t *testing.T) {
	h := newRouter(newServer(time.Now, maxLive))
	const workers, each = 8, 250
	bodies := make([][][]byte, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for range each {
				w := serve(h, issuePath, "")
				bodies[i] = append(bodies[i], w.Body.Bytes())
			}
		})
	}
	wg.Wait()
	toks, ids := map[string]bool{}, map[string]bool{}
	for _, b := range slices.Concat(bodies...) {
		var v struct{ Token, ID string }
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("issue answer %s: %v", b, err)
		}
		if len(v.Token) != tokenLen || strings.Trim(v.Token, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			t.Fatalf("token %q: want %d base64url characters", v.Token, tokenLen)
		}
		if len(v.ID) != 18 {
			t.Fatalf("id %q: want 18 digits", v.ID)
		}
		toks[v.Token], ids[v.ID] = true, true
	}
	if len(toks) != workers*each || len(ids) != workers*each {
		t.Fatalf("%d distinct tokens and %d distinct IDs of %d issued", len(toks), len(ids), workers*each)
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	addr, stop := fixture.Start(t, run)
	tok := tokenOf(t, fixture.Post(t, "http://"+addr, issuePath, ""))
	if w := fixture.Post(t, "http://"+addr, redeemPath, tok); w.Status != http.StatusOK {
		t.Fatalf("POST %s = %d %s, want 200", redeemPath, w.Status, w.Body)
	}
	if err := stop(); err != nil {
		t.Fatalf("run after cancel = %v, want nil", err)
	}
}
