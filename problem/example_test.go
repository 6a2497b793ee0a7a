package problem_test

import (
	"errors"
	"fmt"
	"net/http/httptest"

	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
)

// Example answers errors the way every Replayguard endpoint does: the
// status and code come from the table, a client error says what was wrong
// and a server error never tells its cause.
func Example() {
	for _, err := range []error{
		token.ErrUsed,
		fmt.Errorf("%w: purpose must match ^[A-Za-z0-9._:/-]{1,64}$", token.ErrBadRequest),
		store.Unavailable("redis", errors.New("dial tcp 10.0.0.7:6379: connection refused")),
	} {
		w := httptest.NewRecorder()
		problem.Write(w, err)
		fmt.Println(w.Code, w.Header().Get("Content-Type"), "Retry-After:", w.Header().Get("Retry-After") != "")
		fmt.Print(w.Body.String())
	}
	// Output:
	// 409 application/problem+json Retry-After: false
	// {"type":"urn:replayguard:problem:token_used","title":"Token already used","status":409,"detail":"the token was already redeemed; fetch a new token for a new request","code":"token_used"}
	// 400 application/problem+json Retry-After: false
	// {"type":"urn:replayguard:problem:invalid_request","title":"Invalid request","status":400,"detail":"purpose must match ^[A-Za-z0-9._:/-]{1,64}$","code":"invalid_request"}
	// 503 application/problem+json Retry-After: true
	// {"type":"urn:replayguard:problem:store_unavailable","title":"Store unavailable","status":503,"detail":"the store did not confirm the operation; nothing was done; retry later","code":"store_unavailable"}
}
