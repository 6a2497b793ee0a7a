package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/store"
)

// TestUnexpectedReplyTellsTheShapeOnly: a malformed reply may hold a
// stored response; the error names its shape, never its bytes.
func TestUnexpectedReplyTellsTheShapeOnly(t *testing.T) {
	err := unexpectedReply("acquire", []any{int64(0), "c", "fp", "owner", "Set-Cookie: session=s3cret", nil})
	got := err.Error()
	if strings.Contains(got, "s3cret") || strings.Contains(got, "owner") {
		t.Fatalf("the error reveals the reply's content: %s", got)
	}
	if want := "store: unavailable: redis: acquire: unexpected script reply [0 string(1 bytes) string(2 bytes) string(5 bytes) string(26 bytes) <nil>]"; got != want {
		t.Fatalf("error = %q, want %q", got, want)
	}
}

// TestErrorsSayRedisOnce: go-redis's errors begin with "redis: ", and so
// do the store's; the cause is not prefixed a second time, and errors.Is
// still finds both the store's sentinel and go-redis's own error.
func TestErrorsSayRedisOnce(t *testing.T) {
	mr := miniredis.RunT(t)
	client := goredis.NewClient(&goredis.Options{Addr: mr.Addr()})
	_ = client.Close() // go-redis now answers every command with "redis: client is closed"
	st := New(client)
	_, err := st.Put(context.Background(), "k", store.Token{Purpose: "p"}, time.Minute)
	if err == nil {
		t.Fatal("Put on a closed client succeeded")
	}
	if want := "store: unavailable: redis: put: client is closed"; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, goredis.ErrClosed) {
		t.Errorf("errors.Is lost the chain: %v", err)
	}

	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"go-redis error", errors.New("redis: connection pool timeout"), "store: unavailable: redis: get: connection pool timeout"},
		{"network error", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), "store: unavailable: redis: get: dial tcp 127.0.0.1:1: connect: connection refused"},
		{"out of memory", errors.New("OOM command not allowed when used memory > 'maxmemory'."), "store: full: redis: get: OOM command not allowed when used memory > 'maxmemory'."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fail("get", tc.err).Error(); got != tc.want {
				t.Errorf("fail = %q, want %q", got, tc.want)
			}
			if !errors.Is(fail("get", tc.err), tc.err) {
				t.Error("fail hides its cause from errors.Is")
			}
		})
	}
}
