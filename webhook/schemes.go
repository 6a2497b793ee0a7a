package webhook

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// verifyStandard checks a Standard Webhooks delivery: signatures
// "v1,<base64>" (HMAC-SHA256) and "v1a,<base64>" (ed25519), space
// separated, over "id.timestamp.body"; one valid signature suffices.
func (v *Verifier) verifyStandard(f fields, body []byte) (Delivery, error) {
	if strings.Contains(f.id, ".") {
		// id.timestamp.body must split one way only.
		return Delivery{}, fmt.Errorf("%w: %s contains \".\", which Standard Webhooks forbids", ErrInvalid, lower(f.idName))
	}
	ts, err := parseTimestamp(lower(f.timestampName), f.timestamp)
	if err != nil {
		return Delivery{}, err
	}
	signed := standardContent(f.id, ts, body)
	sigs := strings.Fields(f.signature)
	if len(sigs) > maxSignatures {
		return Delivery{}, fmt.Errorf("%w: %s lists %d signatures, more than %d", ErrInvalid, lower(f.signatureName), len(sigs), maxSignatures)
	}
	var macs [][]byte // computed once, for the first v1 signature
	ok := false
	for _, s := range sigs {
		version, b64, found := strings.Cut(s, ",")
		if !found {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			continue
		}
		switch version {
		case "v1":
			if macs == nil {
				macs = hmacs(v.macKeys, signed)
			}
			ok = anyEqual(macs, sig)
		case "v1a":
			if len(sig) != ed25519.SignatureSize {
				continue
			}
			for _, k := range v.publicKeys {
				if ed25519.Verify(k, signed, sig) {
					ok = true
					break
				}
			}
		}
		if ok {
			break
		}
	}
	if !ok {
		return Delivery{}, fmt.Errorf("%w: no v1 or v1a signature in %s verifies with a configured secret over this id, timestamp and body", ErrInvalid, lower(f.signatureName))
	}
	if err := v.checkTime(ts); err != nil {
		return Delivery{}, err
	}
	if err := checkID(lower(f.idName), f.id); err != nil {
		return Delivery{}, err
	}
	return Delivery{Scheme: Standard, ID: f.id, Timestamp: time.Unix(ts, 0).UTC()}, nil
}

// standardContent is what a Standard Webhooks signature signs:
// "id.timestamp.body".
func standardContent(id string, ts int64, body []byte) []byte {
	b := make([]byte, 0, len(id)+20+len(body))
	b = append(b, id...)
	b = append(b, '.')
	b = strconv.AppendInt(b, ts, 10)
	b = append(b, '.')
	return append(b, body...)
}

// verifyStripe checks a Stripe delivery: Stripe-Signature
// "t=<time>,v1=<hex>[,v1=<hex>…]" over "t.body", keyed with the whsec_
// string; the key is the event's id.
func (v *Verifier) verifyStripe(f fields, body []byte) (Delivery, error) {
	var t string
	var sigs [][]byte
	seenT := false
	for _, item := range strings.Split(f.signature, ",") {
		k, val, found := strings.Cut(strings.TrimSpace(item), "=")
		if !found {
			continue
		}
		switch k {
		case "t":
			if seenT {
				return Delivery{}, fmt.Errorf("%w: Stripe-Signature has more than one t", ErrInvalid)
			}
			t, seenT = val, true
		case "v1":
			if len(sigs) == maxSignatures {
				return Delivery{}, fmt.Errorf("%w: Stripe-Signature has more than %d v1 signatures", ErrInvalid, maxSignatures)
			}
			if sig, err := hex.DecodeString(val); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	if !seenT {
		return Delivery{}, fmt.Errorf("%w: Stripe-Signature has no t", ErrInvalid)
	}
	if len(sigs) == 0 {
		return Delivery{}, fmt.Errorf("%w: Stripe-Signature has no v1 signature", ErrInvalid)
	}
	ts, err := parseTimestamp("Stripe-Signature's t", t)
	if err != nil {
		return Delivery{}, err
	}
	signed := make([]byte, 0, 20+len(body))
	signed = strconv.AppendInt(signed, ts, 10)
	signed = append(signed, '.')
	signed = append(signed, body...)
	macs := hmacs(v.macKeys, signed)
	ok := false
	for _, sig := range sigs {
		if ok = anyEqual(macs, sig); ok {
			break
		}
	}
	if !ok {
		return Delivery{}, fmt.Errorf("%w: no v1 signature in Stripe-Signature verifies with a configured secret over this t and body", ErrInvalid)
	}
	if err := v.checkTime(ts); err != nil {
		return Delivery{}, err
	}
	id, err := stripeEventID(body)
	if err != nil {
		return Delivery{}, err
	}
	return Delivery{Scheme: Stripe, ID: id, Timestamp: time.Unix(ts, 0).UTC()}, nil
}

// stripeEventID returns the id member of a Stripe event: a JSON object
// whose "id" (matched exactly, not case-insensitively) is a string.
func stripeEventID(body []byte) (string, error) {
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(body, &ev); err != nil || ev == nil {
		return "", fmt.Errorf("%w: the Stripe body is not a JSON object", ErrNoID)
	}
	var id string
	raw, ok := ev["id"]
	if !ok || json.Unmarshal(raw, &id) != nil {
		return "", fmt.Errorf("%w: the Stripe event has no string id", ErrNoID)
	}
	if err := checkID("the Stripe event's id", id); err != nil {
		return "", err
	}
	return id, nil
}

// verifyGitHub checks a GitHub delivery: X-Hub-Signature-256
// "sha256=<hex>" over the body. There is no time to check; the key is
// X-GitHub-Delivery.
func (v *Verifier) verifyGitHub(f fields, body []byte) (Delivery, error) {
	hexSig, found := strings.CutPrefix(f.signature, "sha256=")
	sig, err := hex.DecodeString(hexSig)
	if !found || err != nil || len(sig) != sha256.Size {
		return Delivery{}, fmt.Errorf("%w: X-Hub-Signature-256 is not sha256= and 64 hex digits", ErrInvalid)
	}
	if !anyEqual(hmacs(v.macKeys, body), sig) {
		return Delivery{}, fmt.Errorf("%w: X-Hub-Signature-256 does not verify with a configured secret over this body", ErrInvalid)
	}
	if err := checkID("X-GitHub-Delivery", f.id); err != nil {
		return Delivery{}, err
	}
	return Delivery{Scheme: GitHub, ID: f.id}, nil
}

// verifySlack checks a Slack request: X-Slack-Signature "v0=<hex>" over
// "v0:timestamp:body". The key is slackID's.
func (v *Verifier) verifySlack(f fields, body []byte) (Delivery, error) {
	hexSig, found := strings.CutPrefix(f.signature, "v0=")
	sig, err := hex.DecodeString(hexSig)
	if !found || err != nil || len(sig) != sha256.Size {
		return Delivery{}, fmt.Errorf("%w: X-Slack-Signature is not v0= and 64 hex digits", ErrInvalid)
	}
	ts, err := parseTimestamp("X-Slack-Request-Timestamp", f.timestamp)
	if err != nil {
		return Delivery{}, err
	}
	signed := make([]byte, 0, 24+len(body))
	signed = append(signed, "v0:"...)
	signed = strconv.AppendInt(signed, ts, 10)
	signed = append(signed, ':')
	signed = append(signed, body...)
	if !anyEqual(hmacs(v.macKeys, signed), sig) {
		return Delivery{}, fmt.Errorf("%w: X-Slack-Signature does not verify with a configured secret over this timestamp and body", ErrInvalid)
	}
	if err := v.checkTime(ts); err != nil {
		return Delivery{}, err
	}
	return Delivery{Scheme: Slack, ID: slackID(sig, body), Timestamp: time.Unix(ts, 0).UTC()}, nil
}

// The kinds of a Slack delivery's key, each the ID's prefix up to "=",
// so that keys of two kinds never collide.
const (
	slackKindEvent     = "event_id="  // an Events API event: the body's event_id
	slackKindChallenge = "challenge=" // an Events API url_verification: its challenge
	slackKindSignature = "v0="        // anything else: the signature, in lowercase hex
)

// slackID is the key of a verified Slack request: an Events API event
// runs once by its event_id, which Slack keeps when it retries
// (X-Slack-Retry-Num) under a new timestamp and signature; a
// url_verification by its challenge. Slash commands and interactivity
// (form-encoded) carry no ID: their key is the signature, in lowercase
// hex, so that another spelling of the same signature is the same
// delivery. A body that is not a JSON object, or whose ID is not a
// string that checkID accepts, falls back to the signature.
func slackID(sig, body []byte) string {
	if id, ok := slackEventID(body); ok {
		return id
	}
	return slackKindSignature + hex.EncodeToString(sig)
}

// slackEventID returns the kind-prefixed ID of an Events API body: a
// JSON object with a string event_id, or of type url_verification with a
// string challenge (members matched exactly, not case-insensitively).
// Only a body whose first non-blank byte is "{" is decoded, into its
// top-level members: the work and memory are linear in the body, which
// the caller bounds.
func slackEventID(body []byte) (string, bool) {
	if j := bytes.TrimLeft(body, " \t\r\n"); len(j) == 0 || j[0] != '{' {
		return "", false
	}
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(body, &ev); err != nil {
		return "", false
	}
	str := func(name string) string {
		var s string
		if raw, ok := ev[name]; !ok || json.Unmarshal(raw, &s) != nil {
			return ""
		}
		return s
	}
	var id string
	if s := str("event_id"); s != "" {
		id = slackKindEvent + s
	} else if s := str("challenge"); s != "" && str("type") == "url_verification" {
		id = slackKindChallenge + s
	}
	if id == "" || checkID("a Slack delivery's id", id) != nil {
		return "", false
	}
	return id, true
}

// hmacs returns the HMAC-SHA256 of msg under each key.
func hmacs(keys [][]byte, msg []byte) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		m := hmac.New(sha256.New, k)
		m.Write(msg)
		out[i] = m.Sum(nil)
	}
	return out
}

// anyEqual reports, in constant time for each comparison, whether sig is
// one of macs.
func anyEqual(macs [][]byte, sig []byte) bool {
	ok := false
	for _, m := range macs {
		if hmac.Equal(m, sig) {
			ok = true
		}
	}
	return ok
}
