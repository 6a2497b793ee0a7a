package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/replayguard/replayguard/replay"
)

// The client keys of -mode verify. They are fixed test keys, derived from
// public strings so that run.sh and the load program agree without
// passing secrets around: never use them anywhere else. "load clientkeys"
// prints the REPLAYGUARD_CLIENT_KEYS file that holds them.
const (
	hmacKeyID    = "bench"
	ed25519KeyID = "bench-ed"
)

var (
	hmacSecret = func() []byte { s := sha256.Sum256([]byte("replayguard-load-test-hmac-secret")); return s[:] }()
	edPrivate  = func() ed25519.PrivateKey {
		seed := sha256.Sum256([]byte("replayguard-load-test-ed25519-seed"))
		return ed25519.NewKeyFromSeed(seed[:])
	}()
)

// verifyAlgs maps -alg to the RFC 9421 algorithm and the default key ID.
var verifyAlgs = map[string]struct{ alg, keyID string }{
	"hmac":    {replay.AlgHMACSHA256, hmacKeyID},
	"ed25519": {replay.AlgEd25519, ed25519KeyID},
}

// clientKeysFile returns the REPLAYGUARD_CLIENT_KEYS file of the test
// keys, exactly as README.md "Client keys file" says.
func clientKeysFile() ([]byte, error) {
	type entry struct {
		ID        string `json:"id"`
		Alg       string `json:"alg"`
		Secret    string `json:"secret,omitempty"`
		PublicKey string `json:"public_key,omitempty"`
	}
	f := struct {
		Keys []entry `json:"keys"`
	}{[]entry{
		{ID: hmacKeyID, Alg: replay.AlgHMACSHA256, Secret: base64.StdEncoding.EncodeToString(hmacSecret)},
		{ID: ed25519KeyID, Alg: replay.AlgEd25519, PublicKey: base64.StdEncoding.EncodeToString(edPrivate.Public().(ed25519.PublicKey))},
	}}
	b, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// clientKeysCmd is "load clientkeys": it prints the client keys file.
func clientKeysCmd(args []string, w io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected argument %q", args[0])
	}
	b, err := clientKeysFile()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// newSigner returns the Signer of -alg with the key ID keyID.
func newSigner(alg, keyID string) (*replay.Signer, error) {
	a, ok := verifyAlgs[alg]
	if !ok {
		return nil, fmt.Errorf("-alg %q: want hmac or ed25519", alg)
	}
	if keyID == "" {
		keyID = a.keyID
	}
	var key any = hmacSecret
	if a.alg == replay.AlgEd25519 {
		key = edPrivate
	}
	return replay.NewSigner(keyID, a.alg, key)
}

// verifyRequest is the body of POST /v1/signatures/verify.
type verifyRequest struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

// verifyPayload is the body of the signed request each verify request
// describes.
const verifyPayload = `{"item":"book","qty":1}`

// signedBodies returns n bodies of POST /v1/signatures/verify, each
// describing its own freshly signed request: POST target with
// verifyPayload, signed by a replay.Signer (created now, a fresh random
// nonce, content-digest covered), whose Signature-Input, Signature and
// Content-Digest fields are copied into "headers". It signs on every CPU.
func signedBodies(ctx context.Context, s *replay.Signer, target string, n int) ([][]byte, error) {
	out := make([][]byte, n)
	var next atomic.Int64
	errs := make([]error, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				b, err := signedBody(s, target)
				if err != nil {
					errs[w] = err
					return
				}
				out[i] = b
			}
		})
	}
	wg.Wait()
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return nil, fmt.Errorf("signing requests: %w", err)
	}
	return out, nil
}

// signedBody signs one request and describes it as JSON.
func signedBody(s *replay.Signer, target string) ([]byte, error) {
	req, err := http.NewRequest(http.MethodPost, target, bytes.NewReader([]byte(verifyPayload)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if err := s.Sign(req); err != nil {
		return nil, err
	}
	return json.Marshal(verifyRequest{
		Method: req.Method,
		URL:    target,
		Headers: map[string]string{
			"signature-input": req.Header.Get("Signature-Input"),
			"signature":       req.Header.Get("Signature"),
			"content-digest":  req.Header.Get("Content-Digest"),
		},
		Body: base64.StdEncoding.EncodeToString([]byte(verifyPayload)),
	})
}

// issueTokens issues n tokens at issueURL with workers concurrent
// requests and returns them, for -mode redeem. Any answer but 201 with a
// token fails it.
func issueTokens(ctx context.Context, c *http.Client, issueURL, field string, n, workers int) ([]string, error) {
	out := make([]string, n)
	var next atomic.Int64
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				tok, err := issueOne(ctx, c, issueURL, field)
				if err != nil {
					errs[w] = err
					next.Store(int64(n)) // stop the others
					return
				}
				out[i] = tok
			}
		})
	}
	wg.Wait()
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return nil, fmt.Errorf("issuing tokens to redeem: %w", err)
	}
	return out, nil
}

func issueOne(ctx context.Context, c *http.Client, issueURL, field string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, issueURL, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("%s: %s", resp.Status, truncate(body))
	}
	tok := tokenFrom(body, field)
	if tok == "" {
		return "", fmt.Errorf("no %q field in %s", field, truncate(body))
	}
	return tok, nil
}
