// Package testenv decides, in one place, whether a test suite that needs
// an outside part (a Redis server, a Redis Cluster, Chromium, Node, nginx)
// skips or fails when that part is missing. It also holds what tests of
// servers share: free ports, private Redis and PostgreSQL servers, and
// LockedBuffer for a server's output.
package testenv

import (
	"os"
	"testing"
)

// RequireVar is the variable that, set to "1", makes missing parts fail
// the tests instead of skipping them. CI=true does the same.
const RequireVar = "REPLAYGUARD_TEST_REQUIRE"

// Required reports whether every suite must run: REPLAYGUARD_TEST_REQUIRE=1
// or CI=true.
func Required() bool {
	return os.Getenv(RequireVar) == "1" || os.Getenv("CI") == "true"
}

// Missing skips t with reason, or fails it when Required.
func Missing(t testing.TB, reason string) {
	t.Helper()
	if Required() {
		t.Fatalf("%s (required: %s=1 or CI=true)", reason, RequireVar)
	}
	t.Skip(reason)
}

// Var returns the value of the environment variable name; when it is
// unset, Missing skips or fails t.
func Var(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		Missing(t, name+" is not set")
	}
	return v
}
