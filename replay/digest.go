package replay

import (
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/dunglas/httpsfv"
)

// ContentDigest returns the Content-Digest field value (RFC 9530) of
// body with the sha-256 algorithm, e.g. "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"
// for an empty body.
func ContentDigest(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha-256=:" + base64.StdEncoding.EncodeToString(sum[:]) + ":"
}

// maxFieldBytes bounds the Signature-Input, Signature and Content-Digest
// fields Verify parses (all field lines together).
const maxFieldBytes = 8 << 10

// checkContentDigest checks the Content-Digest field values vals against
// body. Every sha-256 and sha-512 member must match; at least one of them
// must be present (members with other algorithms are ignored).
// sc is the scratch to work in.
func checkContentDigest(vals []string, body []byte, sc *scratch) error {
	if len(vals) == 0 {
		return errors.New("no Content-Digest field")
	}
	if fieldLen(vals) > maxFieldBytes {
		return errors.New("Content-Digest field too long")
	}
	if digestsMatch(fieldOf(vals), body, sc) {
		return nil
	}
	// Any refusal, and any field the fast reader does not read, is
	// judged here.
	d, err := httpsfv.UnmarshalDictionary(vals)
	if err != nil {
		return errors.New("Content-Digest is not a structured-field dictionary")
	}
	checked := 0
	for _, alg := range d.Names() {
		var want []byte
		switch alg {
		case "sha-256":
			s := sha256.Sum256(body)
			want = s[:]
		case "sha-512":
			s := sha512.Sum512(body)
			want = s[:]
		default:
			continue
		}
		m, _ := d.Get(alg)
		it, ok := m.(httpsfv.Item)
		if !ok {
			return fmt.Errorf("Content-Digest %s is not a byte sequence", alg)
		}
		got, ok := it.Value.([]byte)
		if !ok {
			return fmt.Errorf("Content-Digest %s is not a byte sequence", alg)
		}
		if subtle.ConstantTimeCompare(got, want) != 1 {
			return fmt.Errorf("Content-Digest %s does not match the body", alg)
		}
		checked++
	}
	if checked == 0 {
		return errors.New("Content-Digest has no sha-256 or sha-512 digest")
	}
	return nil
}

// digestsMatch reports whether field, read by parseDigestFast, has a
// sha-256 or sha-512 member and all of them match body. False means
// "look again with httpsfv", never "refused".
func digestsMatch(field string, body []byte, sc *scratch) bool {
	ds, ok := parseDigestFast(field, sc.digests[:0])
	if !ok {
		return false
	}
	checked := 0
	for _, d := range ds {
		// Every member's byte sequence must decode, as httpsfv requires.
		got, ok := sc.b64.decode(d.b64, sc.digest[:])
		if !ok {
			return false
		}
		var match bool
		switch d.alg {
		case "sha-256":
			s := sha256.Sum256(body)
			match = subtle.ConstantTimeCompare(got, s[:]) == 1
		case "sha-512":
			s := sha512.Sum512(body)
			match = subtle.ConstantTimeCompare(got, s[:]) == 1
		default:
			continue
		}
		if !match {
			return false
		}
		checked++
	}
	return checked > 0
}

// fieldLen is the length of vals joined with ", ".
func fieldLen(vals []string) int {
	n := 0
	for _, v := range vals {
		n += len(v) + 2
	}
	return n
}
