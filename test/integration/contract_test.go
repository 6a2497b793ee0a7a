package integration

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/store/storetest"
	"github.com/replayguard/replayguard/token"
)

const (
	allowedOrigin = "https://shop.example"
	otherOrigin   = "https://evil.example"
)

// contractEnv is a set of servers on the memory store, each configured
// for one part of the contract. They share one key ring, as instances of
// one deployment do, but not their stores.
type contractEnv struct {
	keys []token.Key
	// open: no API keys, no rate limit, CORS for allowedOrigin.
	open *server
	// keyed: API keys set; redeem needs one.
	keyed *server
	// clocked: service and store on clock.
	clocked *server
	clock   *storetest.Clock
	// full holds one token at most.
	full *server
	// broken: every store call fails.
	broken *server
	// forger signs with the same kid as keys but another secret; stranger
	// with a kid the servers do not know.
	forger, stranger *token.Service
}

func newContractEnv(t *testing.T) *contractEnv {
	e := &contractEnv{keys: newKeys(t, "k1"), clock: newFakeClock()}
	e.open = startServer(t, memory.New(), serverConfig{keys: e.keys,
		apiOpts: []handlers.Option{handlers.WithCORSOrigins(allowedOrigin)}})
	e.keyed = startServer(t, memory.New(), serverConfig{keys: e.keys,
		apiOpts: []handlers.Option{handlers.WithAPIKeys(apiKey, "second-api-key")}})
	e.clocked = startServer(t, memory.New(memory.WithClock(e.clock.Now)), serverConfig{keys: e.keys,
		tokenOpts: []token.Option{token.WithClock(e.clock.Now)}})
	e.full = startServer(t, memory.New(memory.WithMaxEntries(1)), serverConfig{keys: e.keys})
	e.broken = startServer(t, brokenStore{}, serverConfig{keys: e.keys})

	e.forger = signer(t, newKeys(t, e.keys[0].ID))
	e.stranger = signer(t, newKeys(t, "unknown-kid"))
	return e
}

// signer returns a token.Service on its own memory store, to mint tokens
// the servers must refuse.
func signer(t *testing.T, keys []token.Key) *token.Service {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	svc, err := token.New(st, keys, token.WithMachineID(nextMachineID()))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// contractCase is one request (or short sequence ending in one) and the
// answer the contract promises for it.
type contractCase struct {
	name string
	// send makes the request; tok is the token it involved, if any.
	send func(t *testing.T, e *contractEnv) (r reply, tok issued)
	// status is the expected HTTP status; code the problem code, or ""
	// for a success.
	status int
	code   string
	// check, when set, inspects the reply further.
	check func(t *testing.T, e *contractEnv, r reply, tok issued)
}

// post returns a send that POSTs body (and header pairs) to path on the
// server pick chooses.
func post(pick func(*contractEnv) *server, path, body string, header ...string) func(*testing.T, *contractEnv) (reply, issued) {
	return func(t *testing.T, e *contractEnv) (reply, issued) {
		return pick(e).do(t, http.MethodPost, path, body, header...), issued{}
	}
}

// redeemWith returns a send that issues a token on the server pick
// chooses with issueBody (and issueHeader pairs), then redeems it there
// with redeemBody and redeemHeader pairs.
func redeemWith(pick func(*contractEnv) *server, issueBody string, issueHeader []string, redeemBody string, redeemHeader ...string) func(*testing.T, *contractEnv) (reply, issued) {
	return func(t *testing.T, e *contractEnv) (reply, issued) {
		s := pick(e)
		tok := s.issue(t, issueBody, issueHeader...)
		return s.redeem(t, tok.Token, redeemBody, redeemHeader...), tok
	}
}

// presenting returns a send that redeems the token mint makes on the
// open server.
func presenting(mint func(t *testing.T, e *contractEnv) string) func(*testing.T, *contractEnv) (reply, issued) {
	return func(t *testing.T, e *contractEnv) (reply, issued) {
		return e.open.redeem(t, mint(t, e), ""), issued{}
	}
}

func open(e *contractEnv) *server    { return e.open }
func keyed(e *contractEnv) *server   { return e.keyed }
func full(e *contractEnv) *server    { return e.full }
func broken(e *contractEnv) *server  { return e.broken }
func clocked(e *contractEnv) *server { return e.clocked }

var bearer = []string{"Authorization", "Bearer " + apiKey}

// stillRedeemable checks that a refused token stays valid: it redeems
// once on the server pick chooses with purpose, subject and header pairs.
func stillRedeemable(pick func(*contractEnv) *server, purpose, subject string, header ...string) func(*testing.T, *contractEnv, reply, issued) {
	return func(t *testing.T, e *contractEnv, _ reply, tok issued) {
		t.Helper()
		body := fmt.Sprintf(`{"purpose":%q,"subject":%q}`, purpose, subject)
		wantRedeemed(t, pick(e).redeem(t, tok.Token, body, header...), tok.ID, purpose, subject)
	}
}

// wantIssued checks a 201 body: field types, purpose, lifetime and the
// token's own claims.
func wantIssued(purpose string, ttl int64) func(*testing.T, *contractEnv, reply, issued) {
	return func(t *testing.T, e *contractEnv, r reply, _ issued) {
		t.Helper()
		wantMediaType(t, r, "application/json")
		if got := r.Header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("Cache-Control = %q, want no-store", got)
		}
		var raw map[string]json.RawMessage
		decode(t, r, &raw)
		for _, name := range []string{"token", "id", "purpose", "expires_at"} {
			if v := raw[name]; len(v) == 0 || v[0] != '"' {
				t.Errorf("%q = %s, want a JSON string", name, v)
			}
		}
		if v := raw["expires_in"]; !regexp.MustCompile(`^[0-9]+$`).Match(v) {
			t.Errorf("expires_in = %s, want a JSON integer", v)
		}
		var is issued
		decode(t, r, &is)
		if !regexp.MustCompile(`^[0-9]+$`).MatchString(is.ID) {
			t.Errorf("id = %q, want a decimal sonyflake ID", is.ID)
		}
		if is.Purpose != purpose {
			t.Errorf("purpose = %q, want %q", is.Purpose, purpose)
		}
		if is.ExpiresIn != ttl {
			t.Errorf("expires_in = %d, want %d", is.ExpiresIn, ttl)
		}
		exp, err := time.Parse(time.RFC3339, is.ExpiresAt)
		if err != nil {
			t.Fatalf("expires_at %q is not RFC 3339: %v", is.ExpiresAt, err)
		}
		if left := time.Until(exp); left < time.Duration(ttl-3)*time.Second || left > time.Duration(ttl+1)*time.Second {
			t.Errorf("expires_at %s is %v away, want about %ds", is.ExpiresAt, left, ttl)
		}
		c, err := e.open.Tokens.Parse(is.Token)
		if err != nil {
			t.Fatalf("the issued token does not parse: %v", err)
		}
		if c.ID != is.ID || c.Purpose != purpose || !c.ExpiresAt.Equal(exp) {
			t.Errorf("token claims %+v disagree with the body %+v", c, is)
		}
	}
}

// noToken checks that a failed issue hands out no token.
func noToken(t *testing.T, _ *contractEnv, r reply, _ issued) {
	t.Helper()
	if strings.Contains(string(r.Body), `"token"`) {
		t.Errorf("a failed issue returned a token: %s", r.Body)
	}
}

// hidesStoreError checks that a 503 never shows the store's own error.
func hidesStoreError(t *testing.T, _ *contractEnv, r reply, _ issued) {
	t.Helper()
	if strings.Contains(string(r.Body), "10.9.8.7") || strings.Contains(string(r.Body), "refused") {
		t.Errorf("the problem leaks the store error: %s", r.Body)
	}
	noToken(t, nil, r, issued{})
}

// bigBody is a JSON object body of exactly n bytes.
func bigBody(n int) string {
	return `{"purpose":"big"}` + strings.Repeat(" ", n-len(`{"purpose":"big"}`))
}

// chunked returns a send that POSTs body to path on the open server with
// Transfer-Encoding: chunked, so no Content-Length announces its size.
func chunked(path, body string) func(*testing.T, *contractEnv) (reply, issued) {
	return func(t *testing.T, e *contractEnv) (reply, issued) {
		req := e.open.request(t, http.MethodPost, path, struct{ io.Reader }{strings.NewReader(body)})
		req.ContentLength = -1
		req.TransferEncoding = []string{"chunked"}
		r, err := send(e.open.Client, req)
		if err != nil {
			t.Fatal(err)
		}
		return r, issued{}
	}
}

func b64(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// algNone is an unsigned token ("alg": "none") with well-formed claims.
func algNone(t *testing.T, e *contractEnv) string {
	now := time.Now().Unix()
	return b64(map[string]any{"alg": "none", "typ": "JWT", "kid": e.keys[0].ID}) + "." +
		b64(map[string]any{"jti": "123456789", "iat": now, "exp": now + 300, "pur": token.DefaultPurpose}) + "."
}

// tampered is a genuine token whose payload was changed to another
// purpose, keeping the original signature.
func tampered(t *testing.T, e *contractEnv) string {
	parts := strings.Split(e.open.issue(t, `{"purpose":"refund"}`).Token, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	claims["pur"] = token.DefaultPurpose
	return parts[0] + "." + b64(claims) + "." + parts[2]
}

// expireBy issues a 10-second token on the clocked server, advances the
// clock by d and redeems it.
func expireBy(d time.Duration) func(*testing.T, *contractEnv) (reply, issued) {
	return func(t *testing.T, e *contractEnv) (reply, issued) {
		tok := e.clocked.issue(t, `{"ttl_seconds":10}`)
		e.clock.Advance(d)
		return e.clocked.redeem(t, tok.Token, ""), tok
	}
}

// TestContract checks every status and problem code of the HTTP contract
// over real HTTP, on the memory store.
func TestContract(t *testing.T) {
	e := newContractEnv(t)
	maxTTL := int64(token.DefaultMaxTTL / time.Second)
	cases := []contractCase{
		// Issue.
		{name: "issue with no body gives a default token", send: post(open, "/v1/tokens", ""),
			status: 201, check: wantIssued(token.DefaultPurpose, int64(token.DefaultTTL/time.Second))},
		{name: "issue with an empty object gives a default token", send: post(open, "/v1/tokens", `{}`),
			status: 201, check: wantIssued(token.DefaultPurpose, int64(token.DefaultTTL/time.Second))},
		{name: "issue takes the purpose from the query", send: post(open, "/v1/tokens?purpose=checkout", ""),
			status: 201, check: wantIssued("checkout", 300)},
		{name: "issue takes the purpose from the body", send: post(open, "/v1/tokens", `{"purpose":"orders/42:pay"}`),
			status: 201, check: wantIssued("orders/42:pay", 300)},
		{name: "ttl_seconds 9 is under the minimum", send: post(open, "/v1/tokens", `{"ttl_seconds":9}`),
			status: 400, code: "invalid_request", check: noToken},
		{name: "ttl_seconds 10 is the minimum", send: post(open, "/v1/tokens", `{"ttl_seconds":10}`),
			status: 201, check: wantIssued(token.DefaultPurpose, 10)},
		{name: "ttl_seconds at the maximum", send: post(open, "/v1/tokens", fmt.Sprintf(`{"ttl_seconds":%d}`, maxTTL)),
			status: 201, check: wantIssued(token.DefaultPurpose, maxTTL)},
		{name: "ttl_seconds one over the maximum", send: post(open, "/v1/tokens", fmt.Sprintf(`{"ttl_seconds":%d}`, maxTTL+1)),
			status: 400, code: "invalid_request"},
		{name: "ttl_seconds zero", send: post(open, "/v1/tokens", `{"ttl_seconds":0}`), status: 400, code: "invalid_request"},
		{name: "ttl_seconds negative", send: post(open, "/v1/tokens", `{"ttl_seconds":-60}`), status: 400, code: "invalid_request"},
		{name: "ttl_seconds huge", send: post(open, "/v1/tokens", `{"ttl_seconds":9223372036854775807}`), status: 400, code: "invalid_request"},
		{name: "ttl_seconds with a fraction", send: post(open, "/v1/tokens", `{"ttl_seconds":10.5}`), status: 400, code: "invalid_request"},
		{name: "ttl_seconds as a string", send: post(open, "/v1/tokens", `{"ttl_seconds":"60"}`), status: 400, code: "invalid_request"},
		{name: "issue with a purpose containing a space", send: post(open, "/v1/tokens", `{"purpose":"two words"}`), status: 400, code: "invalid_request"},
		{name: "issue with a purpose of 65 characters", send: post(open, "/v1/tokens", `{"purpose":"`+strings.Repeat("p", 65)+`"}`), status: 400, code: "invalid_request"},
		{name: "issue with a bad purpose in the query", send: post(open, "/v1/tokens?purpose=two%20words", ""), status: 400, code: "invalid_request"},
		{name: "issue with truncated JSON", send: post(open, "/v1/tokens", `{"purpose":`), status: 400, code: "invalid_request"},
		{name: "issue with a JSON array", send: post(open, "/v1/tokens", `["checkout"]`), status: 400, code: "invalid_request"},
		{name: "issue with two JSON values", send: post(open, "/v1/tokens", `{}{}`), status: 400, code: "invalid_request"},
		{name: "issue with a purpose of the wrong type", send: post(open, "/v1/tokens", `{"purpose":7}`), status: 400, code: "invalid_request"},
		{name: "issue with an unknown field", send: post(open, "/v1/tokens", `{"purpose":"checkout","scope":"all"}`), status: 400, code: "invalid_request"},
		{name: "issue body of exactly 64 KiB is accepted", send: post(open, "/v1/tokens", bigBody(handlers.MaxBodyBytes)),
			status: 201, check: wantIssued("big", 300)},
		{name: "issue body over 64 KiB with Content-Length", send: post(open, "/v1/tokens", bigBody(handlers.MaxBodyBytes+1)),
			status: 413, code: "payload_too_large", check: noToken},
		{name: "issue body over 64 KiB chunked", send: chunked("/v1/tokens", bigBody(handlers.MaxBodyBytes+1)),
			status: 413, code: "payload_too_large", check: noToken},
		{name: "redeem body over 64 KiB with Content-Length", send: post(open, "/v1/tokens/redeem", bigBody(handlers.MaxBodyBytes+1)),
			status: 413, code: "payload_too_large"},
		{name: "redeem body over 64 KiB chunked", send: chunked("/v1/tokens/redeem", bigBody(handlers.MaxBodyBytes+1)),
			status: 413, code: "payload_too_large"},
		{name: "subject without API keys configured", send: post(open, "/v1/tokens", `{"subject":"user-1"}`),
			status: 403, code: "subject_not_allowed", check: noToken},
		{name: "subject without an API key", send: post(keyed, "/v1/tokens", `{"subject":"user-1"}`),
			status: 403, code: "subject_not_allowed", check: noToken},
		{name: "subject with a wrong API key", send: post(keyed, "/v1/tokens", `{"subject":"user-1"}`, "Authorization", "Bearer wrong"),
			status: 403, code: "subject_not_allowed", check: noToken},
		{name: "subject over 256 bytes with an API key", send: post(keyed, "/v1/tokens", `{"subject":"`+strings.Repeat("s", 257)+`"}`, bearer...),
			status: 400, code: "invalid_request"},
		{name: "subject with an API key is issued and redeems with that subject",
			send:   post(keyed, "/v1/tokens", `{"subject":"user-1","purpose":"login"}`, bearer...),
			status: 201,
			check: func(t *testing.T, e *contractEnv, r reply, _ issued) {
				var is issued
				decode(t, r, &is)
				wantRedeemed(t, e.keyed.redeem(t, is.Token, `{"purpose":"login","subject":"user-1"}`, bearer...), is.ID, "login", "user-1")
			}},
		{name: "the second API key works too", send: post(keyed, "/v1/tokens", `{"subject":"user-2"}`, "Authorization", "Bearer second-api-key"),
			status: 201},

		// Redeem.
		{name: "redeem with the token in the header",
			send: redeemWith(open, `{"purpose":"checkout"}`, nil, `{"purpose":"checkout"}`), status: 200,
			check: func(t *testing.T, _ *contractEnv, r reply, tok issued) { wantRedeemed(t, r, tok.ID, "checkout", "") }},
		{name: "redeem with the token in the body",
			send: func(t *testing.T, e *contractEnv) (reply, issued) {
				tok := e.open.issue(t, "")
				return e.open.do(t, http.MethodPost, "/v1/tokens/redeem", fmt.Sprintf(`{"token":%q}`, tok.Token)), tok
			}, status: 200,
			check: func(t *testing.T, _ *contractEnv, r reply, tok issued) {
				wantRedeemed(t, r, tok.ID, token.DefaultPurpose, "")
			}},
		{name: "redeem takes the purpose from the query",
			send: func(t *testing.T, e *contractEnv) (reply, issued) {
				tok := e.open.issue(t, `{"purpose":"checkout"}`)
				return e.open.do(t, http.MethodPost, "/v1/tokens/redeem?purpose=checkout", "", token.Header, tok.Token), tok
			}, status: 200,
			check: func(t *testing.T, _ *contractEnv, r reply, tok issued) { wantRedeemed(t, r, tok.ID, "checkout", "") }},
		{name: "redeem without a purpose does not match a purposed token",
			send: redeemWith(open, `{"purpose":"checkout"}`, nil, ""), status: 403, code: "purpose_mismatch",
			check: stillRedeemable(open, "checkout", "")},
		{name: "a second redeem is token_used",
			send: func(t *testing.T, e *contractEnv) (reply, issued) {
				tok := e.open.issue(t, "")
				wantRedeemed(t, e.open.redeem(t, tok.Token, ""), tok.ID, token.DefaultPurpose, "")
				return e.open.redeem(t, tok.Token, ""), tok
			}, status: 409, code: "token_used"},
		{name: "redeem with a bad purpose", send: redeemWith(open, "", nil, `{"purpose":"two words"}`),
			status: 400, code: "invalid_request", check: stillRedeemable(open, token.DefaultPurpose, "")},
		{name: "redeem with a bad purpose in the query",
			send: func(t *testing.T, e *contractEnv) (reply, issued) {
				tok := e.open.issue(t, "")
				return e.open.do(t, http.MethodPost, "/v1/tokens/redeem?purpose=a%20b", "", token.Header, tok.Token), tok
			}, status: 400, code: "invalid_request", check: stillRedeemable(open, token.DefaultPurpose, "")},
		{name: "purpose mismatch leaves the token valid", send: redeemWith(open, `{"purpose":"checkout"}`, nil, `{"purpose":"login"}`),
			status: 403, code: "purpose_mismatch", check: stillRedeemable(open, "checkout", "")},
		{name: "subject mismatch leaves the token valid",
			send:   redeemWith(keyed, `{"subject":"alice"}`, bearer, `{"subject":"bob"}`, bearer...),
			status: 403, code: "subject_mismatch", check: stillRedeemable(keyed, token.DefaultPurpose, "alice", bearer...)},
		{name: "a bound token redeemed without a subject is a subject mismatch",
			send:   redeemWith(keyed, `{"subject":"alice"}`, bearer, "", bearer...),
			status: 403, code: "subject_mismatch", check: stillRedeemable(keyed, token.DefaultPurpose, "alice", bearer...)},
		{name: "an unbound token redeemed with a subject is a subject mismatch",
			send:   redeemWith(keyed, "", bearer, `{"subject":"alice"}`, bearer...),
			status: 403, code: "subject_mismatch", check: stillRedeemable(keyed, token.DefaultPurpose, "", bearer...)},
		{name: "garbage token", send: presenting(func(*testing.T, *contractEnv) string { return "not-a-token" }),
			status: 401, code: "token_invalid"},
		{name: "three garbage segments", send: presenting(func(*testing.T, *contractEnv) string { return "a.b.c" }),
			status: 401, code: "token_invalid"},
		{name: "token over the size limit", send: presenting(func(*testing.T, *contractEnv) string {
			return strings.Repeat("a", token.MaxTokenLen) + ".b.c"
		}), status: 401, code: "token_invalid"},
		{name: "token forged with another secret under our kid", send: presenting(func(t *testing.T, e *contractEnv) string {
			is, err := e.forger.Issue(t.Context(), token.IssueRequest{})
			if err != nil {
				t.Fatal(err)
			}
			return is.Token
		}), status: 401, code: "token_invalid"},
		{name: "token signed under an unknown kid", send: presenting(func(t *testing.T, e *contractEnv) string {
			is, err := e.stranger.Issue(t.Context(), token.IssueRequest{})
			if err != nil {
				t.Fatal(err)
			}
			return is.Token
		}), status: 401, code: "token_invalid"},
		{name: "unsigned token with alg none", send: presenting(algNone), status: 401, code: "token_invalid"},
		{name: "token with a tampered payload", send: presenting(tampered), status: 401, code: "token_invalid"},
		{name: "expired token", send: expireBy(time.Minute), status: 401, code: "token_expired"},
		{name: "token past exp but inside the leeway, gone from the store, is expired not used",
			send: expireBy(12 * time.Second), status: 401, code: "token_expired"},
		{name: "a token redeemed just before exp is accepted",
			send: expireBy(9 * time.Second), status: 200,
			check: func(t *testing.T, _ *contractEnv, r reply, tok issued) {
				wantRedeemed(t, r, tok.ID, token.DefaultPurpose, "")
			}},
		{name: "redeem with no body and no token", send: post(open, "/v1/tokens/redeem", ""), status: 400, code: "invalid_request"},
		{name: "redeem with an empty object", send: post(open, "/v1/tokens/redeem", `{}`), status: 400, code: "invalid_request"},
		{name: "redeem with a purpose but no token", send: post(open, "/v1/tokens/redeem", `{"purpose":"checkout"}`), status: 400, code: "invalid_request"},
		{name: "redeem with an unknown field", send: redeemWith(open, "", nil, `{"purpos":"default"}`),
			status: 400, code: "invalid_request", check: stillRedeemable(open, token.DefaultPurpose, "")},
		{name: "redeem with bad JSON", send: redeemWith(open, "", nil, `{"token":`),
			status: 400, code: "invalid_request", check: stillRedeemable(open, token.DefaultPurpose, "")},
		{name: "redeem without an API key when keys are set", send: redeemWith(keyed, "", nil, ""),
			status: 401, code: "unauthorized", check: unauthorizedLeavesToken},
		{name: "redeem with a wrong API key", send: redeemWith(keyed, "", nil, "", "Authorization", "Bearer not-the-key"),
			status: 401, code: "unauthorized", check: unauthorizedLeavesToken},
		{name: "redeem with the API key under another scheme", send: redeemWith(keyed, "", nil, "", "Authorization", "Basic "+apiKey),
			status: 401, code: "unauthorized", check: unauthorizedLeavesToken},
		{name: "redeem with the API key", send: redeemWith(keyed, "", nil, "", bearer...), status: 200},

		// Store failures.
		{name: "issue on a full store",
			send: func(t *testing.T, e *contractEnv) (reply, issued) {
				e.full.issue(t, "")
				return e.full.do(t, http.MethodPost, "/v1/tokens", ""), issued{}
			}, status: 503, code: "store_full", check: noToken},
		{name: "issue on a failing store", send: post(broken, "/v1/tokens", ""),
			status: 503, code: "store_unavailable", check: hidesStoreError},
		{name: "redeem on a failing store",
			send: func(t *testing.T, e *contractEnv) (reply, issued) {
				tok := e.open.issue(t, "") // same key ring: it verifies on broken
				return e.broken.redeem(t, tok.Token, ""), tok
			}, status: 503, code: "store_unavailable", check: hidesStoreError},
		{name: "readyz on a failing store",
			send: func(t *testing.T, e *contractEnv) (reply, issued) {
				return e.broken.do(t, http.MethodGet, "/readyz", ""), issued{}
			}, status: 503, code: "store_unavailable", check: hidesStoreError},

		// Routing and probes.
		{name: "unknown path", send: get(open, "/v1/nothing"), status: 404, code: "not_found"},
		{name: "GET on the issue endpoint", send: get(open, "/v1/tokens"), status: 405, code: "method_not_allowed"},
		{name: "DELETE on the redeem endpoint",
			send: func(t *testing.T, e *contractEnv) (reply, issued) {
				return e.open.do(t, http.MethodDelete, "/v1/tokens/redeem", ""), issued{}
			}, status: 405, code: "method_not_allowed"},
		{name: "healthz", send: get(open, "/healthz"), status: 200},
		{name: "healthz on a failing store", send: get(broken, "/healthz"), status: 200},
		{name: "readyz", send: get(open, "/readyz"), status: 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, tok := c.send(t, e)
			if c.code != "" {
				wantProblem(t, r, c.status, c.code)
			} else if r.Status != c.status {
				t.Fatalf("status %d, want %d: %s", r.Status, c.status, r.Body)
			}
			if r.Header.Get(problem.RequestIDHeader) == "" {
				t.Errorf("no %s on the response", problem.RequestIDHeader)
			}
			if c.check != nil {
				c.check(t, e, r, tok)
			}
		})
	}
}

func get(pick func(*contractEnv) *server, path string) func(*testing.T, *contractEnv) (reply, issued) {
	return func(t *testing.T, e *contractEnv) (reply, issued) {
		return pick(e).do(t, http.MethodGet, path, ""), issued{}
	}
}

// unauthorizedLeavesToken checks the 401 challenge and that the token was
// not consumed.
func unauthorizedLeavesToken(t *testing.T, e *contractEnv, r reply, tok issued) {
	t.Helper()
	if got := r.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
		t.Errorf("WWW-Authenticate = %q, want a Bearer challenge", got)
	}
	stillRedeemable(keyed, token.DefaultPurpose, "", bearer...)(t, e, r, tok)
}

// TestCORS checks the preflight and actual-request answers for an
// allowlisted origin and for others.
func TestCORS(t *testing.T) {
	s := startServer(t, memory.New(), serverConfig{apiOpts: []handlers.Option{handlers.WithCORSOrigins(allowedOrigin)}})
	preflight := func(origin, method, headers string) reply {
		h := []string{"Origin", origin, "Access-Control-Request-Method", method}
		if headers != "" {
			h = append(h, "Access-Control-Request-Headers", headers)
		}
		return s.do(t, http.MethodOptions, "/v1/tokens", "", h...)
	}
	cases := []struct {
		name                    string
		origin, method, headers string
		allowed                 bool
	}{
		{"allowed origin asking for POST with content-type", allowedOrigin, "POST", "content-type", true},
		{"allowed origin asking for POST with no headers", allowedOrigin, "POST", "", true},
		{"another origin", otherOrigin, "POST", "content-type", false},
		{"allowed origin on another port", allowedOrigin + ":8443", "POST", "content-type", false},
		{"allowed origin asking for PUT", allowedOrigin, "PUT", "content-type", false},
		{"allowed origin asking for an extra header", allowedOrigin, "POST", "content-type, x-api-key", false},
	}
	for _, c := range cases {
		t.Run("preflight from "+c.name, func(t *testing.T) {
			r := preflight(c.origin, c.method, c.headers)
			acao := r.Header.Get("Access-Control-Allow-Origin")
			if !c.allowed {
				wantProblem(t, r, http.StatusForbidden, "cors_rejected")
				if acao != "" {
					t.Errorf("Access-Control-Allow-Origin = %q on a refused preflight", acao)
				}
				return
			}
			if r.Status != http.StatusNoContent {
				t.Fatalf("status %d, want 204: %s", r.Status, r.Body)
			}
			if acao != c.origin {
				t.Errorf("Access-Control-Allow-Origin = %q, want %q", acao, c.origin)
			}
			if m := r.Header.Get("Access-Control-Allow-Methods"); !strings.Contains(m, "POST") {
				t.Errorf("Access-Control-Allow-Methods = %q, want POST", m)
			}
			if h := r.Header.Get("Access-Control-Allow-Headers"); !strings.EqualFold(h, "content-type") {
				t.Errorf("Access-Control-Allow-Headers = %q, want Content-Type", h)
			}
		})
	}
	t.Run("POST from the allowed origin carries the CORS headers", func(t *testing.T) {
		r := s.do(t, http.MethodPost, "/v1/tokens", "", "Origin", allowedOrigin)
		if r.Status != http.StatusCreated || r.Header.Get("Access-Control-Allow-Origin") != allowedOrigin {
			t.Errorf("status %d, Access-Control-Allow-Origin %q; want 201 and %q", r.Status, r.Header.Get("Access-Control-Allow-Origin"), allowedOrigin)
		}
	})
	t.Run("POST from another origin carries none", func(t *testing.T) {
		r := s.do(t, http.MethodPost, "/v1/tokens", "", "Origin", otherOrigin)
		if got := r.Header.Get("Access-Control-Allow-Origin"); got != "" {
			t.Errorf("Access-Control-Allow-Origin = %q for another origin", got)
		}
	})
	// With allowed origins the answer depends on Origin: caches must key
	// on it, whatever Origin (or none) this request had.
	for _, origin := range []string{allowedOrigin, otherOrigin, ""} {
		t.Run("POST with Origin "+strconv.Quote(origin)+" says Vary: Origin", func(t *testing.T) {
			var h []string
			if origin != "" {
				h = []string{"Origin", origin}
			}
			r := s.do(t, http.MethodPost, "/v1/tokens", "", h...)
			if got := r.Header.Values("Vary"); !slices.Contains(got, "Origin") {
				t.Errorf("Vary = %q, want Origin among them", got)
			}
		})
	}
	t.Run("without allowed origins the answer does not vary by Origin", func(t *testing.T) {
		plain := startServer(t, memory.New(), serverConfig{})
		r := plain.do(t, http.MethodPost, "/v1/tokens", "", "Origin", allowedOrigin)
		if r.Status != http.StatusCreated || r.Header.Get("Access-Control-Allow-Origin") != "" || len(r.Header.Values("Vary")) != 0 {
			t.Errorf("status %d, Access-Control-Allow-Origin %q, Vary %q; want 201 and neither", r.Status, r.Header.Get("Access-Control-Allow-Origin"), r.Header.Values("Vary"))
		}
	})
}

// TestIssueRateLimit checks 429 rate_limited with a whole-second
// Retry-After past the burst, and that a valid API key is never limited.
func TestIssueRateLimit(t *testing.T) {
	mem := memory.New()
	s := startServer(t, mem, serverConfig{apiOpts: []handlers.Option{
		handlers.WithAPIKeys(apiKey),
		handlers.WithIssueRate(mem, store.Limit{Rate: 2, Burst: 2, Period: time.Minute}),
	}})
	for i := range 2 {
		if r := s.do(t, http.MethodPost, "/v1/tokens", ""); r.Status != http.StatusCreated {
			t.Fatalf("issue %d within the burst: status %d: %s", i+1, r.Status, r.Body)
		}
	}
	r := s.do(t, http.MethodPost, "/v1/tokens", "")
	wantProblem(t, r, http.StatusTooManyRequests, "rate_limited")
	retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 60 {
		t.Errorf("Retry-After = %q, want whole seconds in [1, 60]", r.Header.Get("Retry-After"))
	}
	noToken(t, nil, r, issued{})

	wantProblem(t, s.do(t, http.MethodPost, "/v1/tokens", "", "Authorization", "Bearer wrong"), http.StatusTooManyRequests, "rate_limited")
	for i := range 5 {
		if r := s.do(t, http.MethodPost, "/v1/tokens", "", bearer...); r.Status != http.StatusCreated {
			t.Fatalf("issue %d with a valid API key: status %d, want 201: %s", i+1, r.Status, r.Body)
		}
	}
	wantProblem(t, s.do(t, http.MethodPost, "/v1/tokens", ""), http.StatusTooManyRequests, "rate_limited")
}

// TestMetrics checks that /metrics exposes the service's families, with
// the counts of one issue, one redemption and one replay.
func TestMetrics(t *testing.T) {
	s := startServer(t, memory.New(), serverConfig{})
	tok := s.issue(t, "")
	wantRedeemed(t, s.redeem(t, tok.Token, ""), tok.ID, token.DefaultPurpose, "")
	wantProblem(t, s.redeem(t, tok.Token, ""), http.StatusConflict, "token_used")

	r := s.do(t, http.MethodGet, "/metrics", "")
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	wantMediaType(t, r, "text/plain")
	text := string(r.Body)
	for _, family := range []string{
		"# TYPE replayguard_tokens_issued_total counter",
		"# TYPE replayguard_redemptions_total counter",
		"# TYPE replayguard_store_duration_seconds histogram",
		"# TYPE replayguard_store_errors_total counter",
		"# TYPE go_goroutines gauge",
	} {
		if !strings.Contains(text, family+"\n") {
			t.Errorf("/metrics lacks %q", family)
		}
	}
	for _, sample := range []string{
		"replayguard_tokens_issued_total 1",
		`replayguard_redemptions_total{outcome="redeemed"} 1`,
		`replayguard_redemptions_total{outcome="token_used"} 1`,
		`replayguard_store_duration_seconds_count{op="put"} 1`,
		`replayguard_store_duration_seconds_count{op="redeem"} 2`,
		`replayguard_store_errors_total{op="redeem"} 0`,
	} {
		if !strings.Contains(text, "\n"+sample+"\n") {
			t.Errorf("/metrics lacks the sample %q", sample)
		}
	}
}

// TestRequestID checks that every answer carries an X-Request-ID, that a
// well-formed incoming one is kept, and that problems repeat it.
func TestRequestID(t *testing.T) {
	s := startServer(t, memory.New(), serverConfig{})
	cases := []struct {
		name, incoming string
		kept           bool
	}{
		{"no incoming ID gets one", "", false},
		{"a valid incoming ID is kept", "req-42_a.B", true},
		{"an ID with a space is replaced", "req 42", false},
		{"an ID over 128 bytes is replaced", strings.Repeat("r", 129), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var h []string
			if c.incoming != "" {
				h = []string{problem.RequestIDHeader, c.incoming}
			}
			for _, path := range []string{"/healthz", "/v1/nothing"} {
				r := s.do(t, http.MethodGet, path, "", h...)
				got := r.Header.Get(problem.RequestIDHeader)
				switch {
				case got == "":
					t.Errorf("GET %s: no %s", path, problem.RequestIDHeader)
				case c.kept && got != c.incoming:
					t.Errorf("GET %s: %s = %q, want %q", path, problem.RequestIDHeader, got, c.incoming)
				case !c.kept && got == c.incoming:
					t.Errorf("GET %s: the malformed ID %q was echoed", path, got)
				}
				if path == "/v1/nothing" {
					var p problem.Problem
					decode(t, r, &p)
					if p.RequestID != got {
						t.Errorf("problem request_id = %q, want %q", p.RequestID, got)
					}
				}
			}
		})
	}
}
