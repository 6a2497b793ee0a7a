// Command redeem-client plays the part of an application backend, in any
// language, that uses a running Replayguard server over HTTP: before it
// carries out a protected action it calls POST /v1/tokens/redeem with the
// token the client sent, and proceeds only on 200 "redeemed".
//
// Redeem a token a browser received from POST /v1/tokens:
//
//	go run ./examples/redeem-client -url http://127.0.0.1:8080 -purpose checkout -token eyJhbGci...
//
// Without -token it first issues a token itself (as a browser would), then
// redeems it twice to show the replay refused:
//
//	go run ./examples/redeem-client -url http://127.0.0.1:8080
//
// With -record it redeems with "record": true, so that a duplicate gets
// the first request's response instead of a refusal: on "redeemed" it
// places an order (simulated) and stores its response, a 303 to
// /orders/<n>, with POST /v1/tokens/complete; on "replayed" it answers
// with the stored response and places nothing; when placing the order
// fails (-fail) it gives the token back with POST /v1/tokens/release.
// Without -token it shows a double submit: the second attempt gets the
// same 303 and no second order (with -fail: the first attempt fails and
// the retry places the order):
//
//	go run ./examples/redeem-client -record
//	go run ./examples/redeem-client -record -fail
//
// When the server has REPLAYGUARD_API_KEYS set, pass one of them with
// -api-key or, to keep it out of the process list, in the
// REDEEM_CLIENT_API_KEY environment variable.
//
// The exit status is 0 when the token was redeemed, 1 when it was
// refused, and 2 when the server could not be asked. With -record, 0
// means the order was placed and its response stored, or the stored
// response was replayed; 1 also means placing the order failed and the
// token was given back, or its response was refused; 2 also means
// complete or release could not be asked. Without -token it is the first
// attempt's status (with -record -fail, the retry's).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Result is what a backend learns from one call.
type Result struct {
	// Status is the HTTP status.
	Status int
	// Redeemed is true only for 200 {"status":"redeemed"}: the one answer
	// on which the protected action may go ahead.
	Redeemed bool
	// Replayed is true for 200 {"status":"replayed"}: the token has a
	// record, and Response is the response of its first request, to send
	// the client instead of carrying the action out again.
	Replayed bool
	// Response is the recorded response, when Replayed.
	Response *Response
	// Lease names the execution RedeemRecord started: pass it to Complete
	// or Release, so that they never end a later execution's record.
	Lease string
	// ID, Purpose and Subject are the redeemed token's claims.
	ID, Purpose, Subject string
	// Code and Detail describe a refusal (the problem's code and detail).
	Code, Detail string
}

// Response is an HTTP response as the token records API stores and
// replays it: the status, one value per header name, and the body, which
// is standard base64 in JSON (as encoding/json writes a []byte).
type Response struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    []byte            `json:"body"`
}

// Client calls a Replayguard server.
type Client struct {
	// BaseURL is the server's root, e.g. http://127.0.0.1:8080.
	BaseURL string
	// APIKey is sent as Authorization: Bearer when set.
	APIKey string
	// HTTP is the client used; its timeout bounds each call.
	HTTP *http.Client
}

// Redeem asks the server to redeem tok for purpose and subject. A nil
// error with Redeemed false is a refusal, or a replay when the token has
// a record. An error means the outcome is unknown (timeout, connection
// lost): treat it as a refusal too, never as success.
func (c *Client) Redeem(ctx context.Context, tok, purpose, subject string) (Result, error) {
	return c.redeem(ctx, tok, purpose, subject, false)
}

// RedeemRecord is Redeem with "record": true: the first redemption also
// opens a processing record for the token's response, which the caller
// must fill with Complete, or give up with Release, within the server's
// lease (REPLAYGUARD_IDEMPOTENCY_LOCK_TTL). A duplicate gets 409
// request_in_progress while the record is processing and Replayed with
// the stored response once it is complete.
func (c *Client) RedeemRecord(ctx context.Context, tok, purpose, subject string) (Result, error) {
	return c.redeem(ctx, tok, purpose, subject, true)
}

func (c *Client) redeem(ctx context.Context, tok, purpose, subject string, record bool) (Result, error) {
	body, err := json.Marshal(map[string]any{"token": tok, "purpose": purpose, "subject": subject, "record": record})
	if err != nil {
		return Result{}, err
	}
	var ok struct {
		Status, ID, Purpose, Subject, Lease string
		Response                            *Response
	}
	res, err := c.post(ctx, "/v1/tokens/redeem", body, &ok)
	if err != nil {
		return Result{}, err
	}
	if res.Status == http.StatusOK {
		res.Redeemed, res.Replayed = ok.Status == "redeemed", ok.Status == "replayed"
		res.ID, res.Purpose, res.Subject, res.Lease = ok.ID, ok.Purpose, ok.Subject, ok.Lease
		if res.Replayed {
			res.Response = ok.Response
		}
	}
	return res, nil
}

// Complete stores resp as the response of tok's one execution (POST
// /v1/tokens/complete), after RedeemRecord redeemed it with lease. It
// succeeded when Status is 204; 409 record_not_processing means the lease
// ended first.
func (c *Client) Complete(ctx context.Context, tok, lease string, resp Response) (Result, error) {
	body, err := json.Marshal(map[string]any{"token": tok, "lease": lease, "response": resp})
	if err != nil {
		return Result{}, err
	}
	return c.post(ctx, "/v1/tokens/complete", body, nil)
}

// Release gives tok back after its action failed (POST
// /v1/tokens/release), so that a retry can redeem it. It succeeded when
// Status is 204.
func (c *Client) Release(ctx context.Context, tok, lease string) (Result, error) {
	body, err := json.Marshal(map[string]string{"token": tok, "lease": lease})
	if err != nil {
		return Result{}, err
	}
	return c.post(ctx, "/v1/tokens/release", body, nil)
}

// Issued is a token from POST /v1/tokens.
type Issued struct {
	Token     string `json:"token"`
	ID        string `json:"id"`
	Purpose   string `json:"purpose"`
	ExpiresIn int    `json:"expires_in"`
}

// Issue asks the server for a token, as a browser page would.
func (c *Client) Issue(ctx context.Context, purpose string) (Issued, error) {
	body, err := json.Marshal(map[string]string{"purpose": purpose})
	if err != nil {
		return Issued{}, err
	}
	var is Issued
	res, err := c.post(ctx, "/v1/tokens", body, &is)
	if err != nil {
		return Issued{}, err
	}
	if res.Status != http.StatusCreated {
		return Issued{}, fmt.Errorf("issue: %d %s: %s", res.Status, res.Code, res.Detail)
	}
	return is, nil
}

// post sends body as JSON to path and decodes a 2xx answer into ok
// (unless ok is nil); a problem answer fills Result's Code and Detail.
func (c *Client) post(ctx context.Context, path string, body []byte, ok any) (Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return Result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Result{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Result{}, err
	}
	res := Result{Status: resp.StatusCode}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if ok == nil {
			return res, nil
		}
		if err := json.Unmarshal(data, ok); err != nil {
			return Result{}, fmt.Errorf("%s: %d with an unreadable body: %w", path, resp.StatusCode, err)
		}
		return res, nil
	}
	var problem struct{ Code, Detail string }
	if json.Unmarshal(data, &problem) != nil || problem.Code == "" {
		problem.Code = "unexpected_response"
	}
	res.Code, res.Detail = problem.Code, problem.Detail
	return res, nil
}

// Action is the protected action: it returns the response to send the
// client, or an error when it failed and may be tried again.
type Action func(ctx context.Context) (Response, error)

// handle is what a backend does, in record mode, with a request that
// carries tok: redeem with "record": true; on "redeemed" run action and
// store its response with Complete, or give the token back with Release
// when it fails; on "replayed" answer with the stored response and run
// nothing. It prints each step to out, prefixed with label, and returns
// the response for the client (nil when there is none) and the exit
// status (see the package comment).
func handle(ctx context.Context, c *Client, tok, purpose, subject string, action Action, out io.Writer, label string) (*Response, int) {
	res, err := c.RedeemRecord(ctx, tok, purpose, subject)
	switch {
	case err != nil:
		// Unknown outcome: do not carry out the action.
		fmt.Fprintf(out, "%s: no answer (%v): do not proceed\n", label, err)
		return nil, 2
	case res.Replayed && res.Response != nil:
		fmt.Fprintf(out, "%s: %d replayed id=%s: not placed again; answer with the stored response: %s\n", label, res.Status, res.ID, describe(*res.Response))
		return res.Response, 0
	case !res.Redeemed:
		fmt.Fprintf(out, "%s: %d %s: do not proceed\n", label, res.Status, refusal(res))
		return nil, 1
	}
	fmt.Fprintf(out, "%s: %d redeemed id=%s purpose=%s subject=%q: proceed\n", label, res.Status, res.ID, res.Purpose, res.Subject)

	resp, err := action(ctx)
	if err != nil {
		// Give the token back, so the client's retry can run the action.
		rel, rerr := c.Release(ctx, tok, res.Lease)
		switch {
		case rerr != nil:
			fmt.Fprintf(out, "%s: the action failed (%v); release: no answer (%v): the token is redeemable again once the lease ends\n", label, err, rerr)
			return nil, 2
		case rel.Status != http.StatusNoContent:
			fmt.Fprintf(out, "%s: the action failed (%v); release: %d %s\n", label, err, rel.Status, refusal(rel))
		default:
			fmt.Fprintf(out, "%s: the action failed (%v); released the token for a retry\n", label, err)
		}
		return nil, 1
	}
	// Store the response before sending it, so a duplicate gets it.
	done, err := c.Complete(ctx, tok, res.Lease, resp)
	switch {
	case err != nil:
		fmt.Fprintf(out, "%s: done, %s; complete: no answer (%v): the response may not be stored\n", label, describe(resp), err)
		return &resp, 2
	case done.Status != http.StatusNoContent:
		fmt.Fprintf(out, "%s: done, %s; complete: %d %s: the response is not stored\n", label, describe(resp), done.Status, refusal(done))
		return &resp, 1
	}
	fmt.Fprintf(out, "%s: done, stored the response: %s\n", label, describe(resp))
	return &resp, 0
}

// describe summarises a response for the output: its status and Location.
func describe(r Response) string {
	s := fmt.Sprint(r.Status)
	if loc := r.Headers["Location"]; loc != "" {
		s += " Location: " + loc
	}
	return s
}

// refusal is a refusal's problem code, with its detail when there is one.
func refusal(r Result) string {
	if r.Detail == "" {
		return r.Code
	}
	return r.Code + " (" + r.Detail + ")"
}

// shop is the simulated protected action: placing an order.
type shop struct {
	orders int // orders placed
	fail   int // how many more attempts fail
}

// place places an order and answers as a form handler does after a POST:
// 303 See Other to the new order's page.
func (s *shop) place(context.Context) (Response, error) {
	if s.fail > 0 {
		s.fail--
		return Response{}, errors.New("the payment provider timed out")
	}
	s.orders++
	return Response{
		Status:  http.StatusSeeOther,
		Headers: map[string]string{"Location": fmt.Sprintf("/orders/%d", s.orders), "Content-Type": "text/plain; charset=utf-8"},
		Body:    fmt.Appendf(nil, "order %d placed\n", s.orders),
	}, nil
}

// run is main without the process: it returns the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("redeem-client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("url", "http://127.0.0.1:8080", "Replayguard server URL")
	tok := fs.String("token", "", "token to redeem; empty issues one first and shows a duplicate")
	purpose := fs.String("purpose", "checkout", "purpose to redeem for")
	subject := fs.String("subject", "", "subject the token is bound to, if any")
	record := fs.Bool("record", false, "redeem with \"record\": true, place an order and store its response (or replay the stored one)")
	fail := fs.Bool("fail", false, "with -record: placing the order fails once, so the token is released")
	apiKey := fs.String("api-key", "", "API key, when the server has REPLAYGUARD_API_KEYS (default $REDEEM_CLIENT_API_KEY)")
	timeout := fs.Duration("timeout", 5*time.Second, "timeout of each call")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *fail && !*record {
		fmt.Fprintln(stderr, "redeem-client: -fail needs -record")
		return 2
	}
	if *apiKey == "" {
		*apiKey = getenv("REDEEM_CLIENT_API_KEY") // not a flag default: -h would print it
	}
	c := &Client{BaseURL: *base, APIKey: *apiKey, HTTP: &http.Client{Timeout: *timeout}}
	defer c.HTTP.CloseIdleConnections()

	attempts, counted := 1, 1 // counted: the attempt whose status is the exit status
	if *tok == "" {
		is, err := c.Issue(ctx, *purpose)
		if err != nil {
			fmt.Fprintln(stderr, "redeem-client:", err)
			return 2
		}
		fmt.Fprintf(stdout, "issued token %s for %q, expires in %ds\n", is.ID, is.Purpose, is.ExpiresIn)
		*tok, attempts = is.Token, 2
		if *fail {
			attempts, counted = 3, 2
		}
	}

	s := &shop{}
	if *fail {
		s.fail = 1
	}
	code := 0
	for i := 1; i <= attempts; i++ {
		status := 0
		if *record {
			_, status = handle(ctx, c, *tok, *purpose, *subject, s.place, stdout, fmt.Sprintf("attempt #%d", i))
		} else {
			status = redeemOnce(ctx, c, *tok, *purpose, *subject, stdout, i)
		}
		if i == counted {
			code = status
		}
	}
	return code
}

// redeemOnce is one plain redemption (without a record); it prints the
// answer and returns the exit status.
func redeemOnce(ctx context.Context, c *Client, tok, purpose, subject string, out io.Writer, i int) int {
	res, err := c.Redeem(ctx, tok, purpose, subject)
	switch {
	case err != nil:
		// Unknown outcome: do not carry out the action.
		fmt.Fprintf(out, "redeem #%d: no answer (%v): do not proceed\n", i, err)
		return 2
	case res.Redeemed:
		fmt.Fprintf(out, "redeem #%d: %d redeemed id=%s purpose=%s subject=%q: proceed\n", i, res.Status, res.ID, res.Purpose, res.Subject)
		return 0
	case res.Replayed:
		// The token was redeemed with a record (-record): its first
		// request's response stands; the action does not run again.
		fmt.Fprintf(out, "redeem #%d: %d replayed id=%s: do not proceed\n", i, res.Status, res.ID)
		return 1
	default:
		fmt.Fprintf(out, "redeem #%d: %d %s: do not proceed\n", i, res.Status, res.Code)
		return 1
	}
}
