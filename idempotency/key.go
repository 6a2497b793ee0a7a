package idempotency

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dunglas/httpsfv"
)

// ParseKey returns the key in an Idempotency-Key field value, per
// draft-ietf-httpapi-idempotency-key-header: an RFC 8941 sf-string
// ("abc"; parameters are ignored) of 1 to MaxKeyLength characters. A
// bare value is accepted too (abc, or a UUID without quotes), when it is
// visible ASCII without quotes, backslashes, commas or semicolons that
// does not start with a colon (an sf-binary such as :YWJj: is refused).
// Anything else is ErrInvalidKey, with the reason as detail.
func ParseKey(value string) (string, error) {
	v := strings.Trim(value, " \t")
	var key string
	switch {
	case v == "":
		return "", fmt.Errorf("%w: the Idempotency-Key header is empty", ErrInvalidKey)
	case v[0] == '"':
		item, err := httpsfv.UnmarshalItem([]string{v})
		s, isString := item.Value.(string)
		if err != nil || !isString {
			return "", fmt.Errorf("%w: the Idempotency-Key header is not an RFC 8941 sf-string such as \"8e03978e-40d5\"", ErrInvalidKey)
		}
		key = s
	case v[0] == ':':
		return "", fmt.Errorf("%w: the Idempotency-Key header is a byte sequence, not an RFC 8941 sf-string such as \"8e03978e-40d5\"", ErrInvalidKey)
	default:
		for i := 0; i < len(v); i++ {
			if b := v[i]; b <= ' ' || b >= 0x7f || strings.IndexByte("\"\\,;", b) >= 0 {
				return "", fmt.Errorf("%w: the Idempotency-Key header is neither an RFC 8941 sf-string such as \"8e03978e-40d5\" nor a bare value of visible ASCII", ErrInvalidKey)
			}
		}
		key = v
	}
	switch n := utf8.RuneCountInString(key); {
	case n == 0:
		return "", fmt.Errorf("%w: the Idempotency-Key is empty", ErrInvalidKey)
	case n > MaxKeyLength:
		return "", fmt.Errorf("%w: the Idempotency-Key is %d characters long, more than %d", ErrInvalidKey, n, MaxKeyLength)
	}
	return key, nil
}
