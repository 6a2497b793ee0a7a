package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
)

// TestRedisLoggerSaysRedisOnce: go-redis's messages that begin with
// "redis: " are logged as they are; the others get the prefix.
func TestRedisLoggerSaysRedisOnce(t *testing.T) {
	for _, tc := range []struct{ format, arg, want string }{
		{"redis: discarding bad PubSub connection: %s", "EOF", "redis: discarding bad PubSub connection: EOF"},
		{"sentinel: new master=%q", "rg", `redis: sentinel: new master="rg"`},
		{"specified duration is %s", "1µs", "redis: specified duration is 1µs"},
	} {
		var buf bytes.Buffer
		redisLogger{slog.New(slog.NewJSONHandler(&buf, nil))}.Printf(context.Background(), tc.format, tc.arg)
		var rec struct{ Msg, Level string }
		if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
			t.Fatalf("%s: %v", buf.String(), err)
		}
		if rec.Msg != tc.want || rec.Level != "WARN" {
			t.Errorf("logged %q at %s, want %q at WARN", rec.Msg, rec.Level, tc.want)
		}
	}
}
