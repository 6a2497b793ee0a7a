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
// When the server has REPLAYGUARD_API_KEYS set, pass one of them with
// -api-key or, to keep it out of the process list, in the
// REDEEM_CLIENT_API_KEY environment variable.
//
// The exit status is 0 when the token was redeemed, 1 when it was
// refused, and 2 when the server could not be asked (without -token: the
// first redemption's).
package main

import (
	"bytes"
	"context"
	"encoding/json"
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

// Result is what a backend learns from one redeem call.
type Result struct {
	// Status is the HTTP status.
	Status int
	// Redeemed is true only for 200 {"status":"redeemed"}: the one answer
	// on which the protected action may go ahead.
	Redeemed bool
	// ID, Purpose and Subject are the redeemed token's claims.
	ID, Purpose, Subject string
	// Code and Detail describe a refusal (the problem's code and detail).
	Code, Detail string
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
// error with Redeemed false is a refusal. An error means the outcome is
// unknown (timeout, connection lost): treat it as a refusal too, never
// as success.
func (c *Client) Redeem(ctx context.Context, tok, purpose, subject string) (Result, error) {
	body, err := json.Marshal(map[string]string{"token": tok, "purpose": purpose, "subject": subject})
	if err != nil {
		return Result{}, err
	}
	var ok struct {
		Status, ID, Purpose, Subject string
	}
	res, err := c.post(ctx, "/v1/tokens/redeem", body, &ok)
	if err != nil {
		return Result{}, err
	}
	if res.Status == http.StatusOK && ok.Status == "redeemed" {
		res.Redeemed, res.ID, res.Purpose, res.Subject = true, ok.ID, ok.Purpose, ok.Subject
	}
	return res, nil
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

// post sends body as JSON to path and decodes a 2xx answer into ok; a
// problem answer fills Result's Code and Detail.
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

// run is main without the process: it returns the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("redeem-client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("url", "http://127.0.0.1:8080", "Replayguard server URL")
	tok := fs.String("token", "", "token to redeem; empty issues one first and redeems it twice")
	purpose := fs.String("purpose", "checkout", "purpose to redeem for")
	subject := fs.String("subject", "", "subject the token is bound to, if any")
	apiKey := fs.String("api-key", "", "API key, when the server has REPLAYGUARD_API_KEYS (default $REDEEM_CLIENT_API_KEY)")
	timeout := fs.Duration("timeout", 5*time.Second, "timeout of each call")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *apiKey == "" {
		*apiKey = getenv("REDEEM_CLIENT_API_KEY") // not a flag default: -h would print it
	}
	c := &Client{BaseURL: *base, APIKey: *apiKey, HTTP: &http.Client{Timeout: *timeout}}
	defer c.HTTP.CloseIdleConnections()

	attempts := 1
	if *tok == "" {
		is, err := c.Issue(ctx, *purpose)
		if err != nil {
			fmt.Fprintln(stderr, "redeem-client:", err)
			return 2
		}
		fmt.Fprintf(stdout, "issued token %s for %q, expires in %ds\n", is.ID, is.Purpose, is.ExpiresIn)
		*tok, attempts = is.Token, 2
	}

	code := 0
	for i := 1; i <= attempts; i++ {
		res, err := c.Redeem(ctx, *tok, *purpose, *subject)
		status := 0
		switch {
		case err != nil:
			// Unknown outcome: do not carry out the action.
			fmt.Fprintf(stdout, "redeem #%d: no answer (%v): do not proceed\n", i, err)
			status = 2
		case res.Redeemed:
			fmt.Fprintf(stdout, "redeem #%d: %d redeemed id=%s purpose=%s subject=%q: proceed\n", i, res.Status, res.ID, res.Purpose, res.Subject)
		default:
			fmt.Fprintf(stdout, "redeem #%d: %d %s: do not proceed\n", i, res.Status, res.Code)
			status = 1
		}
		if i == 1 {
			code = status
		}
	}
	return code
}
