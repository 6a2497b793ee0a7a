package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// fetchKid issues one real token at issueURL and returns the kid of its
// header, without verifying it.
func fetchKid(ctx context.Context, c *http.Client, issueURL, field string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, issueURL, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("fetching a token for its kid: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("fetching a token for its kid: %w", err)
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("fetching a token for its kid: %s: %s", resp.Status, truncate(body))
	}
	tok := tokenFrom(body, field)
	if tok == "" {
		return "", fmt.Errorf("fetching a token for its kid: no %q field in %s", field, truncate(body))
	}
	return kidOf(tok)
}

// kidOf returns the kid of a JWT's header, without verifying the token.
func kidOf(tok string) (string, error) {
	t, _, err := jwt.NewParser().ParseUnverified(tok, jwt.MapClaims{})
	if err != nil {
		return "", fmt.Errorf("reading the kid: %w", err)
	}
	kid, _ := t.Header["kid"].(string)
	if kid == "" {
		return "", errors.New("reading the kid: the token's header has no kid")
	}
	return kid, nil
}

// forgeTokens returns n distinct well-formed HS256 JWTs with the given kid
// and the claims a Replayguard token carries (jti, iat, exp, pur), valid
// for an hour from now, signed with a random key that no server holds.
func forgeTokens(kid string, n int, now time.Time) ([]string, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("forging tokens: %w", err)
	}
	out := make([]string, n)
	for i := range out {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("forging tokens: %w", err)
		}
		jti := strconv.FormatUint(binary.BigEndian.Uint64(b[:])>>1, 10)
		tok, err := signToken(kid, key, jti, now)
		if err != nil {
			return nil, err
		}
		out[i] = tok
	}
	return out, nil
}

// signToken signs a token shaped like Replayguard's with key.
func signToken(kid string, key []byte, jti string, now time.Time) (string, error) {
	t := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"jti": jti,
		"iat": now.Add(-time.Second).Unix(),
		"exp": now.Add(time.Hour).Unix(),
		"pur": "default",
	})
	t.Header["kid"] = kid
	s, err := t.SignedString(key)
	if err != nil {
		return "", fmt.Errorf("forging tokens: %w", err)
	}
	return s, nil
}
