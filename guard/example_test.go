package guard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/webhook"
)

// exampleKeys is the client keys file of the examples; a real one is read
// with replay.NewKeyRing(os.Getenv("REPLAYGUARD_CLIENT_KEYS")).
const exampleKeys = `{"keys": [{"id": "partner-1", "alg": "hmac-sha256",
  "secret": "ZXhhbXBsZSBvbmx5OiAzMiBieXRlcyBvciBsb25nZXIh", "label": "Example partner"}]}`

// A shop protects its routes with the three middlewares, which are plain
// func(http.Handler) http.Handler: on a net/http ServeMux as they are, on
// Gin through guard.Gin. Tokens, idempotency records and nonces share one
// memory store here; use store/redis to run more than one instance.
//
//   - RequireToken spends the single-use token that Field put in the
//     checkout form, so the form is carried out once: its second submit
//     is refused with 409 token_used;
//   - Idempotent runs POST /orders once per Idempotency-Key and answers a
//     retry with the stored response, marked Idempotent-Replayed;
//   - RequireSignature lets through a partner's signed request (RFC 9421)
//     once: the same request sent again is 401 replayed_request.
func Example() {
	gin.SetMode(gin.ReleaseMode) // no debug output

	// Real keys come from token.ParseKeys(os.Getenv("REPLAYGUARD_SIGNING_KEYS")).
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	keeper := idempotency.New(st) // 60s lease, 24h retention, 1 MiB bodies
	clientKeys, err := replay.ParseKeys([]byte(exampleKeys))
	if err != nil {
		fmt.Println(err)
		return
	}
	verifier := replay.NewVerifier(clientKeys, st)

	orders := 0
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, orders)
	})

	// net/http: a no-JavaScript checkout form, and an API route.
	mux := http.NewServeMux()
	mux.HandleFunc("GET /checkout", func(w http.ResponseWriter, r *http.Request) {
		field, err := guard.Field(r, svc, "checkout")
		if err != nil {
			problem.Write(w, err)
			return
		}
		fmt.Fprintf(w, `<form method="post" action="/checkout">%s<button>Pay</button></form>`, field)
	})
	mux.Handle("POST /checkout", guard.RequireToken(svc, "checkout")(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			orders++
			guard.SeeOther(w, r, fmt.Sprintf("/orders/%d", orders))
		})))
	mux.Handle("POST /orders", guard.Idempotent(keeper)(createOrder))

	// Gin: the same middlewares through guard.Gin.
	r := gin.New()
	_ = r.SetTrustedProxies(nil) // the client IP, which scopes idempotency keys, is the peer's
	r.POST("/orders", guard.Gin(guard.Idempotent(keeper)), gin.WrapH(createOrder))
	r.POST("/v1/orders", guard.Gin(guard.RequireSignature(verifier)), func(c *gin.Context) {
		sig, _ := guard.SignatureFrom(c.Request.Context())
		body, _ := io.ReadAll(c.Request.Body)
		c.String(http.StatusCreated, "order %s from %s", body, sig.KeyID)
	})

	fmt.Println("net/http, RequireToken:")
	page := httptest.NewRecorder()
	mux.ServeHTTP(page, httptest.NewRequest(http.MethodGet, "/checkout", nil))
	tok := html.UnescapeString(regexp.MustCompile(`value="([^"]+)"`).FindStringSubmatch(page.Body.String())[1])
	for range 2 { // the user presses Pay twice
		req := httptest.NewRequest(http.MethodPost, "/checkout", strings.NewReader(url.Values{token.FormField: {tok}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(" ", w.Code, w.Header().Get("Location")+summary(w))
	}

	for _, app := range []struct {
		name string
		h    http.Handler
		key  string
	}{{"net/http", mux, `"order-a"`}, {"Gin", r, `"order-b"`}} {
		fmt.Printf("%s, Idempotent:\n", app.name)
		for range 2 { // the client retries after a timeout
			req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(idempotency.KeyHeader, app.key)
			w := httptest.NewRecorder()
			app.h.ServeHTTP(w, req)
			fmt.Println(" ", w.Code, w.Body.String(), "replayed:", w.Header().Get(idempotency.ReplayedHeader) == "true")
		}
	}

	fmt.Println("Gin, RequireSignature:")
	// Client side: the partner's shared secret, as in the keys file.
	signer, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, []byte("example only: 32 bytes or longer!"))
	if err != nil {
		fmt.Println(err)
		return
	}
	signed := httptest.NewRequest(http.MethodPost, "http://shop.example/v1/orders", strings.NewReader(`{"item":"pen"}`))
	if err := signer.Sign(signed); err != nil {
		fmt.Println(err)
		return
	}
	for range 2 { // the second time, an attacker sends the captured request again
		req := httptest.NewRequest(http.MethodPost, "http://shop.example/v1/orders", strings.NewReader(`{"item":"pen"}`))
		req.Header = signed.Header.Clone()
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(" ", w.Code, summary(w))
	}
	fmt.Println("orders placed:", orders)
	// Output:
	// net/http, RequireToken:
	//   303 /orders/1
	//   409 problem token_used
	// net/http, Idempotent:
	//   201 {"order":2} replayed: false
	//   201 {"order":2} replayed: true
	// Gin, Idempotent:
	//   201 {"order":3} replayed: false
	//   201 {"order":3} replayed: true
	// Gin, RequireSignature:
	//   201 order {"item":"pen"} from partner-1
	//   401 problem replayed_request
	// orders placed: 3
}

// The Gin middleware lets a request through once per token; the replay is
// refused with 409 token_used before the handler runs. guard.Gin adapts
// any of this package's middlewares to Gin, and TokenFrom finds the
// claims in c.Request's context.
func ExampleGin() {
	gin.SetMode(gin.ReleaseMode) // no debug output
	// Real keys come from token.ParseKeys(os.Getenv("REPLAYGUARD_SIGNING_KEYS")).
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}

	r := gin.New()
	r.POST("/checkout", guard.Gin(guard.RequireToken(svc, "checkout")), func(c *gin.Context) {
		claims, _ := guard.TokenFrom(c.Request.Context())
		c.String(http.StatusOK, "order placed (purpose %s)", claims.Purpose)
	})

	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/checkout", nil)
		req.Header.Set(token.Header, is.Token)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, summary(w))
	}
	// Output:
	// 200 order placed (purpose checkout)
	// 409 problem token_used
}

// The net/http middleware reads the token from the idempotency_token form
// field that HiddenField renders, so a plain HTML form is protected; the
// form reaches the handler unread.
func ExampleRequireToken() {
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}

	mux := http.NewServeMux()
	mux.Handle("POST /comments", guard.RequireToken(svc, "comment")(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			claims, _ := guard.TokenFrom(r.Context())
			fmt.Fprintf(w, "comment %q saved (purpose %s)", r.PostFormValue("text"), claims.Purpose)
		})))

	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "comment"})
	if err != nil {
		fmt.Println(err)
		return
	}
	form := url.Values{token.FormField: {is.Token}, "text": {"first!"}}.Encode()
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/comments", strings.NewReader(form))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, summary(w))
	}
	// Output:
	// 200 comment "first!" saved (purpose comment)
	// 409 problem token_used
}

// With WithRecords, a double submit of a form is not refused: it gets
// the first submit's answer again, the same 303 to the same order page,
// marked Idempotent-Replayed. The order is placed once.
func ExampleWithRecords() {
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New() // or a store/redis Store shared by every instance
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	keeper := idempotency.New(st) // 60s lease, 24h retention, 1 MiB bodies

	orders := 0
	mux := http.NewServeMux()
	mux.Handle("POST /checkout", guard.RequireToken(svc, "checkout", guard.WithRecords(keeper))(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			orders++
			guard.SeeOther(w, r, fmt.Sprintf("/orders/%d", orders))
		})))

	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		fmt.Println(err)
		return
	}
	form := url.Values{token.FormField: {is.Token}}.Encode()
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/checkout", strings.NewReader(form))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Location"), "replayed:", w.Header().Get(idempotency.ReplayedHeader) == "true")
	}
	fmt.Println("orders placed:", orders)
	// Output:
	// 303 /orders/1 replayed: false
	// 303 /orders/1 replayed: true
	// orders placed: 1
}

// An HTML application renders its own page for a refused form with
// WithErrorHandler; FailureReason says why, and problem.For gives the
// status.
func ExampleWithErrorHandler() {
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}

	refused := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reason := guard.FailureReason(r)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(problem.For(reason).Status)
		switch {
		case errors.Is(reason, token.ErrUsed):
			fmt.Fprint(w, "<p>This form was already sent.</p>")
		case errors.Is(reason, token.ErrExpired):
			fmt.Fprint(w, "<p>This form has expired; reload the page.</p>")
		default:
			fmt.Fprint(w, "<p>Please reload the page and try again.</p>")
		}
	})
	protected := guard.RequireToken(svc, "signup", guard.WithErrorHandler(refused))(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "<p>Welcome!</p>") }))

	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "signup"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, tok := range []string{is.Token, is.Token, ""} {
		req := httptest.NewRequest(http.MethodPost, "/signup", nil)
		if tok != "" {
			req.Header.Set(token.Header, tok)
		}
		w := httptest.NewRecorder()
		protected.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String())
	}
	// Output:
	// 200 <p>Welcome!</p>
	// 409 <p>This form was already sent.</p>
	// 400 <p>Please reload the page and try again.</p>
}

// HiddenField renders the form input a no-JavaScript form carries; the
// value is HTML-escaped. Field issues a token and renders it in one call.
func ExampleHiddenField() {
	fmt.Println(guard.HiddenField("eyJhbGciOi.eyJleHAiOj.L9sEhriC"))
	// Output:
	// <input type="hidden" name="idempotency_token" value="eyJhbGciOi.eyJleHAiOj.L9sEhriC">
}

// The server verifies signed requests with the middleware, here on Gin;
// the client signs with replay.Transport, a fresh nonce per request. A
// captured request sent again is refused.
func ExampleRequireSignature() {
	gin.SetMode(gin.ReleaseMode) // no debug output

	// Server side.
	keys, err := replay.ParseKeys([]byte(exampleKeys))
	if err != nil {
		fmt.Println(err)
		return
	}
	st := memory.New() // or redisstore.New(client): the store tokens use
	defer st.Close()
	r := gin.New()
	r.POST("/v1/orders", guard.Gin(guard.RequireSignature(replay.NewVerifier(keys, st))), func(c *gin.Context) {
		sig, _ := guard.SignatureFrom(c.Request.Context())
		body, _ := io.ReadAll(c.Request.Body)
		c.String(http.StatusCreated, "order %s from %s", body, sig.KeyID)
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	// Client side: the shared secret, as in the keys file.
	signer, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, []byte("example only: 32 bytes or longer!"))
	if err != nil {
		fmt.Println(err)
		return
	}
	var captured *http.Request
	client := &http.Client{Transport: &replay.Transport{Signer: signer, Base: capture{&captured}}}
	for range 2 {
		resp, err := client.Post(srv.URL+"/v1/orders?id=7", "application/json", strings.NewReader(`{"item":"book"}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body))
	}

	// An attacker sends the last signed request again.
	again := captured.Clone(captured.Context())
	again.Body, _ = captured.GetBody()
	resp, err := http.DefaultTransport.RoundTrip(again)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	var p problem.Problem
	_ = json.NewDecoder(resp.Body).Decode(&p)
	fmt.Println(resp.StatusCode, p.Code)
	// Output:
	// 201 order {"item":"book"} from partner-1
	// 201 order {"item":"book"} from partner-1
	// 401 replayed_request
}

// capture is a RoundTripper that remembers the last (signed) request it
// sends.
type capture struct{ last **http.Request }

func (c capture) RoundTrip(req *http.Request) (*http.Response, error) {
	*c.last = req
	return http.DefaultTransport.RoundTrip(req)
}

// summary condenses an answer for the examples: "problem" and the code of
// a problem+json answer, else the body.
func summary(w *httptest.ResponseRecorder) string {
	if w.Header().Get("Content-Type") != "application/problem+json" {
		return w.Body.String()
	}
	var p problem.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		return err.Error()
	}
	return "problem " + p.Code
}

// A service receives Standard Webhooks deliveries and runs each once,
// however often the sender delivers it; the sender, here in the same
// program, signs them with package webhook's Signer, so one library covers
// both ends. The second delivery repeats the first (same webhook-id,
// signed again): it gets the first response back, and the handler runs
// once. A forged delivery is refused before anything is recorded.
func ExampleRequireWebhook() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // example only: webhook.GenerateSecret makes one

	// Receiver.
	v, err := webhook.New(webhook.Standard, []string{secret})
	if err != nil {
		fmt.Println(err)
		return
	}
	st := memory.New() // or redisstore.New(client)
	defer st.Close()
	runs := 0
	mux := http.NewServeMux()
	mux.Handle("POST /hooks/billing", guard.RequireWebhook(v, idempotency.New(st))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := guard.WebhookFrom(r.Context())
			runs++
			fmt.Fprintf(w, "handled %s (run %d)", d.ID, runs)
		})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// Sender.
	signer, err := webhook.NewSigner([]string{secret})
	if err != nil {
		fmt.Println(err)
		return
	}
	deliver := func(id string, sign bool) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/hooks/billing", strings.NewReader(`{"type":"invoice.paid"}`))
		if sign {
			if err := signer.SignRequest(req, id); err != nil {
				fmt.Println(err)
				return
			}
		} else {
			req.Header.Set("webhook-id", id)
			req.Header.Set("webhook-timestamp", "1700000000")
			req.Header.Set("webhook-signature", "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 400 {
			var p problem.Problem
			_ = json.Unmarshal(body, &p)
			body = []byte(p.Code)
		}
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body))
	}
	deliver("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", true)
	deliver("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", true) // the sender's retry
	deliver("msg_forged", false)
	// Output:
	// 200  handled msg_2KWPBgLlAfxdpx2AI54pPJ85f4W (run 1)
	// 200 true handled msg_2KWPBgLlAfxdpx2AI54pPJ85f4W (run 1)
	// 401  signature_invalid
}
