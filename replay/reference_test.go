package replay

// This file keeps Verify as it was before its fast paths (the
// hand-written readers of sfv.go, the pooled scratch and HMACs), renamed
// referenceVerify and run by FuzzVerifyMatchesReference: the Verify of
// today must answer every request exactly as this one does, error text
// included.

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/replayguard/replayguard/store"
)

// referenceVerify is Verify as it was.
func (v *Verifier) referenceVerify(ctx context.Context, m Message) (Result, error) {
	inputVals := headerValues(m.Header, "Signature-Input")
	sigVals := headerValues(m.Header, "Signature")
	if blank(inputVals) || blank(sigVals) {
		return Result{}, ErrMissing
	}
	if fieldLen(inputVals) > maxFieldBytes || fieldLen(sigVals) > maxFieldBytes {
		return Result{}, invalid("Signature-Input or Signature is over %d bytes", maxFieldBytes)
	}
	inputs, err := httpsfv.UnmarshalDictionary(inputVals)
	if err != nil {
		return Result{}, invalid("Signature-Input is not a structured-field dictionary")
	}
	sigs, err := httpsfv.UnmarshalDictionary(sigVals)
	if err != nil {
		return Result{}, invalid("Signature is not a structured-field dictionary")
	}

	name, input, key, err := v.refChoose(inputs)
	if err != nil {
		return Result{}, err
	}
	p, err := refParseSigParams(input.Params)
	if err != nil {
		return Result{}, invalid("%s: %v", name, err)
	}
	if p.hasAlg && p.alg != key.Alg {
		return Result{}, invalid("%s: alg %q is not the algorithm of key %q", name, clip(p.alg), clip(key.ID))
	}
	if !v.unsafe {
		if !p.hasCreated {
			return Result{}, invalid("%s: no created parameter", name)
		}
		if !p.hasNonce {
			return Result{}, invalid("%s: no nonce parameter", name)
		}
	}
	sigMember, ok := sigs.Get(name)
	if !ok {
		return Result{}, invalid("Signature has no member %s", name)
	}
	sigItem, ok := sigMember.(httpsfv.Item)
	if !ok {
		return Result{}, invalid("Signature %s is not a byte sequence", name)
	}
	sig, ok := sigItem.Value.([]byte)
	if !ok {
		return Result{}, invalid("Signature %s is not a byte sequence", name)
	}

	covered := make(map[string]bool, len(input.Items))
	for _, it := range input.Items {
		if s, ok := it.Value.(string); ok {
			covered[s] = true
		}
	}
	if !v.unsafe {
		for _, r := range DefaultRequired {
			if !refCovers(covered, r) {
				return Result{}, invalid("%s does not cover %s", name, r)
			}
		}
		for _, r := range v.required {
			if !refCovers(covered, r) {
				return Result{}, invalid("%s does not cover %s", name, clip(r))
			}
		}
		if len(m.Body) > 0 && !covered[compContentDigest] {
			return Result{}, invalid("%s does not cover content-digest and the request has a body", name)
		}
	}
	if covered[compContentDigest] {
		if err := refCheckContentDigest(headerValues(m.Header, compContentDigest), m.Body); err != nil {
			return Result{}, invalid("%v", err)
		}
	}

	base, err := refSignatureBase(m, name, input)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := refCheckSignature(key, []byte(base), sig); err != nil {
		return Result{}, invalid("%s: %v", name, err)
	}

	res := Result{KeyID: key.ID, Label: key.Label, Nonce: p.nonce, Name: name}
	if p.hasCreated {
		res.Created = time.Unix(p.created, 0).UTC()
	}
	if v.unsafe {
		return res, nil
	}

	now := v.now()
	if err := v.checkWindow(now, p); err != nil {
		return Result{}, err
	}
	if v.store == nil {
		return Result{}, fmt.Errorf("%w: no nonce store", store.ErrUnavailable)
	}
	// Past the window's far edge by this clock, on the store's clock.
	keep := res.Created.Add(v.window + time.Second).Sub(now)
	fresh, err := v.store.Put(ctx, store.NonceKey(key.ID, p.nonce), store.Token{}, keep)
	if err != nil {
		return Result{}, err
	}
	if !fresh {
		return Result{}, ErrReplayed
	}
	return res, nil
}

// refChoose returns the first member of inputs whose keyid names a known key.
func (v *Verifier) refChoose(inputs *httpsfv.Dictionary) (string, httpsfv.InnerList, Key, error) {
	names := inputs.Names()
	if len(names) == 0 {
		return "", httpsfv.InnerList{}, Key{}, invalid("Signature-Input is empty")
	}
	sawKeyID := false
	for _, name := range names {
		mem, _ := inputs.Get(name)
		il, ok := mem.(httpsfv.InnerList)
		if !ok || il.Params == nil {
			continue
		}
		raw, ok := il.Params.Get("keyid")
		if !ok {
			continue
		}
		id, ok := raw.(string)
		if !ok {
			continue
		}
		sawKeyID = true
		if v.keys == nil {
			continue
		}
		if key, ok := v.keys.Lookup(id); ok {
			return name, il, key, nil
		}
	}
	if sawKeyID {
		return "", httpsfv.InnerList{}, Key{}, invalid("unknown keyid")
	}
	return "", httpsfv.InnerList{}, Key{}, invalid("no signature in Signature-Input has a keyid")
}

// refParseSigParams checks the types of the known signature parameters and
// the nonce's length. Unknown parameters are allowed; they are signed.
func refParseSigParams(ps *httpsfv.Params) (sigParams, error) {
	var p sigParams
	if ps == nil {
		return p, nil
	}
	for _, k := range ps.Names() {
		raw, _ := ps.Get(k)
		var ok bool
		switch k {
		case "created":
			p.created, ok = raw.(int64)
			p.hasCreated = true
		case "expires":
			p.expires, ok = raw.(int64)
			p.hasExpires = true
		case "nonce":
			p.nonce, ok = raw.(string)
			p.hasNonce = true
			if ok && (p.nonce == "" || len(p.nonce) > MaxNonceLen) {
				return p, fmt.Errorf("nonce must be 1 to %d bytes", MaxNonceLen)
			}
		case "alg":
			p.alg, ok = raw.(string)
			p.hasAlg = true
		case "keyid", "tag":
			_, ok = raw.(string)
		default:
			ok = true
		}
		if !ok {
			if k == "created" || k == "expires" {
				return p, fmt.Errorf("%s must be an integer", k)
			}
			return p, fmt.Errorf("%s must be a string", k)
		}
	}
	return p, nil
}

// refCovers reports whether the covered components satisfy the requirement
// r: r itself, or @target-uri for @query.
func refCovers(covered map[string]bool, r string) bool {
	return covered[r] || (r == compQuery && covered[compTargetURI])
}

// refCheckSignature verifies sig over base with key's own algorithm.
func refCheckSignature(key Key, base, sig []byte) error {
	switch key.Alg {
	case AlgHMACSHA256:
		if len(key.Secret) == 0 {
			return errors.New("the key has no secret")
		}
		mac := hmac.New(sha256.New, key.Secret)
		mac.Write(base)
		if !hmac.Equal(mac.Sum(nil), sig) {
			return errors.New("wrong signature")
		}
		return nil
	case AlgEd25519:
		if len(key.PublicKey) != ed25519.PublicKeySize {
			return errors.New("the key has no valid public key")
		}
		if len(sig) != ed25519.SignatureSize || !ed25519.Verify(key.PublicKey, base, sig) {
			return errors.New("wrong signature")
		}
		return nil
	}
	return errors.New("the key has an unsupported algorithm")
}

// refSignatureBase is SignatureBase as it was.
func refSignatureBase(m Message, name string, input httpsfv.InnerList) (string, error) {
	var b strings.Builder
	b.Grow(64 * (len(input.Items) + 2))
	seen := make(map[string]bool, len(input.Items))
	for i, it := range input.Items {
		comp, ok := it.Value.(string)
		if !ok {
			return "", fmt.Errorf("%w: %s: covered component %d is not a string", errBase, name, i)
		}
		if it.Params != nil && len(it.Params.Names()) > 0 {
			return "", fmt.Errorf("%w: %s: component %q: parameters are not supported", errBase, name, comp)
		}
		if seen[comp] {
			return "", fmt.Errorf("%w: %s: component %q is listed twice", errBase, name, comp)
		}
		seen[comp] = true
		v, err := refComponentValue(m, comp)
		if err != nil {
			return "", fmt.Errorf("%w: %s: component %q: %v", errBase, name, comp, err)
		}
		if strings.ContainsAny(v, "\r\n") {
			return "", fmt.Errorf("%w: %s: component %q: value holds a line break", errBase, name, comp)
		}
		// A string with no parameters serialises as a quoted string; the
		// name was checked to be a lowercase token-ish string below, so
		// no escaping is needed, but serialise properly all the same.
		b.WriteString(refQuoteSF(comp))
		b.WriteString(": ")
		b.WriteString(v)
		b.WriteByte('\n')
	}
	params, err := serializeParams(input)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", errBase, name, err)
	}
	b.WriteString(`"@signature-params": `)
	b.WriteString(params)
	return b.String(), nil
}

// refQuoteSF serialises s as a structured-field string (RFC 9651 §4.1.6).
// Component names come from a parsed string or a caller, so escape " and
// \ as the serialisation requires.
func refQuoteSF(s string) string {
	if !strings.ContainsAny(s, `"\`) {
		return `"` + s + `"`
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// refComponentValue returns the value of one covered component of m.
func refComponentValue(m Message, comp string) (string, error) {
	if strings.HasPrefix(comp, "@") {
		return refDerivedValue(m, comp)
	}
	if !validFieldName(comp) {
		return "", errors.New("not a lowercase field name")
	}
	return refFieldValue(m, comp)
}

// refFieldValue returns the canonicalised value of the HTTP field name
// (RFC 9421 §2.1): each field line's value with leading and trailing
// whitespace removed, joined with ", ".
func refFieldValue(m Message, name string) (string, error) {
	vals := headerValues(m.Header, name)
	if len(vals) == 0 {
		return "", errors.New("the request has no such field")
	}
	if len(vals) == 1 {
		return strings.Trim(vals[0], " \t"), nil
	}
	var b strings.Builder
	for i, v := range vals {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strings.Trim(v, " \t"))
	}
	return b.String(), nil
}

// refDerivedValue returns the value of a derived component (RFC 9421 §2.2).
func refDerivedValue(m Message, comp string) (string, error) {
	switch comp {
	case compMethod:
		if m.Method == "" {
			return "", errors.New("the request has no method")
		}
		return m.Method, nil
	case compSigParams:
		return "", errors.New("@signature-params cannot be covered")
	}
	u := m.URL
	if u == nil {
		return "", errors.New("the request has no URL")
	}
	switch comp {
	case compAuthority:
		return authority(u)
	case compScheme:
		if u.Scheme == "" {
			return "", errors.New("the request URL has no scheme")
		}
		return strings.ToLower(u.Scheme), nil
	case compTargetURI:
		if u.Scheme == "" {
			return "", errors.New("the request URL has no scheme")
		}
		a, err := authority(u)
		if err != nil {
			return "", err
		}
		s := strings.ToLower(u.Scheme) + "://" + a + path(u)
		if u.RawQuery != "" || u.ForceQuery {
			s += "?" + u.RawQuery
		}
		return s, nil
	case compRequestTarget:
		s := path(u)
		if u.RawQuery != "" || u.ForceQuery {
			s += "?" + u.RawQuery
		}
		return s, nil
	case compPath:
		return path(u), nil
	case compQuery:
		return "?" + u.RawQuery, nil
	}
	return "", errors.New("unsupported derived component")
}

// refCheckContentDigest is checkContentDigest as it was.
func refCheckContentDigest(vals []string, body []byte) error {
	if len(vals) == 0 {
		return errors.New("no Content-Digest field")
	}
	if fieldLen(vals) > maxFieldBytes {
		return errors.New("Content-Digest field too long")
	}
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
