package replay

// UnsafeSkipPolicyForTests turns off the policy: created and nonce are
// not required, neither are any components (DefaultRequired, WithRequired,
// content-digest), the window, expires and WithNotBefore are ignored and
// no nonce is recorded (the store is never called). Still checked: the
// syntax, a known keyid, alg, parameter types, a covered Content-Digest
// against the body, and the signature. It exists so that the RFC 9421
// test vectors (no nonce, created in 2021) can be verified; it is defined
// in a test file, so it is not part of the API.
func UnsafeSkipPolicyForTests() Option { return func(s *settings) { s.unsafe = true } }

// componentValue returns the value of one covered component of m, as
// the signature base holds it.
func componentValue(m Message, comp string) (string, error) {
	b, err := appendComponent(nil, m, comp)
	return string(b), err
}
