package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestUnknownVariablesAreWarnedAtStart: the running server logs one WARN
// line for each REPLAYGUARD_* variable that is no setting, naming it and
// the closest setting, and none for settings, their _FILE forms or the
// tests' REPLAYGUARD_TEST_* variables.
func TestUnknownVariablesAreWarnedAtStart(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "api-keys")
	if err := os.WriteFile(keys, []byte("an-api-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, out := server(t,
		"REPLAYGUARD_TOKN_TTL=10m",
		"REPLAYGUARD_SIGNING_KEYS_FLIE=/run/secrets/keys",
		"REPLAYGUARD_API_KEYS_FILE="+keys,
		"REPLAYGUARD_LOG_LEVEL=info",
		"REPLAYGUARD_TEST_UNKNOWN_TO_THE_SERVER=1",
	)
	want := map[string]string{
		"REPLAYGUARD_TOKN_TTL":          "REPLAYGUARD_TOKEN_TTL",
		"REPLAYGUARD_SIGNING_KEYS_FLIE": "REPLAYGUARD_SIGNING_KEYS_FILE",
	}
	got := map[string][]string{}
	for _, rec := range logRecords(t, out.String()) {
		if rec["msg"] != unknownVariableMsg {
			continue
		}
		name, _ := rec["variable"].(string)
		closest, _ := rec["closest_setting"].(string)
		if rec["level"] != "WARN" {
			t.Errorf("%v: want level WARN", rec)
		}
		got[name] = append(got[name], closest)
	}
	for name, closest := range want {
		if len(got[name]) != 1 || got[name][0] != closest {
			t.Errorf("warnings for %s name %q, want one naming %s\n%s", name, got[name], closest, out.String())
		}
	}
	for _, name := range []string{"REPLAYGUARD_API_KEYS_FILE", "REPLAYGUARD_LOG_LEVEL", "REPLAYGUARD_TEST_UNKNOWN_TO_THE_SERVER", "REPLAYGUARD_TEST_RUN_MAIN", "REPLAYGUARD_ADDR"} {
		if len(got[name]) != 0 {
			t.Errorf("a warning for %s, which is no unknown variable", name)
		}
	}
}

func TestUnknownVariables(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    []unknownVariable
	}{
		{"a letter left out", []string{"REPLAYGUARD_TOKN_TTL=5m"}, []unknownVariable{{"REPLAYGUARD_TOKN_TTL", "REPLAYGUARD_TOKEN_TTL"}}},
		{"two letters swapped", []string{"REPLAYGUARD_REDIS_ULR=redis://r"}, []unknownVariable{{"REPLAYGUARD_REDIS_ULR", "REPLAYGUARD_REDIS_URL"}}},
		{"a letter left out of a _FILE", []string{"REPLAYGUARD_API_KEY_FILE=/k"}, []unknownVariable{{"REPLAYGUARD_API_KEY_FILE", "REPLAYGUARD_API_KEYS_FILE"}}},
		{"_FILE on a setting that is no secret", []string{"REPLAYGUARD_TOKEN_TTL_FILE=/t"}, []unknownVariable{{"REPLAYGUARD_TOKEN_TTL_FILE", "REPLAYGUARD_TOKEN_TTL"}}},
		{"an empty value", []string{"REPLAYGUARD_ISSUE_RATES="}, []unknownVariable{{"REPLAYGUARD_ISSUE_RATES", "REPLAYGUARD_ISSUE_RATE"}}},
		{"twice in the environment, once", []string{"REPLAYGUARD_TOKN_TTL=1m", "REPLAYGUARD_TOKN_TTL=2m"}, []unknownVariable{{"REPLAYGUARD_TOKN_TTL", "REPLAYGUARD_TOKEN_TTL"}}},
		{"in the environment's order", []string{"REPLAYGUARD_TOKN_TTL=1m", "PATH=/bin", "REPLAYGUARD_API_KEY=k"},
			[]unknownVariable{{"REPLAYGUARD_TOKN_TTL", "REPLAYGUARD_TOKEN_TTL"}, {"REPLAYGUARD_API_KEY", "REPLAYGUARD_API_KEYS"}}},
		{"settings and their _FILE forms are known", []string{"REPLAYGUARD_TOKEN_TTL=5m", "REPLAYGUARD_SIGNING_KEYS_FILE=/k", "REPLAYGUARD_POSTGRES_URL_FILE=/p", "REPLAYGUARD_SHUTDOWN_TIMEOUT=8s"}, nil},
		{"the tests' variables are left out", []string{"REPLAYGUARD_TEST_REDIS_URL=redis://r", "REPLAYGUARD_TEST_RUN_MAIN=1"}, nil},
		{"other variables are left out", []string{"PATH=/bin", "OTEL_SERVICE_NAME=x", "GOGC=400", "replayguard_token_ttl=5m", "XREPLAYGUARD_ADDR=:1"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := unknownVariables(tc.environ); !slices.Equal(got, tc.want) {
				t.Fatalf("= %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"TOKEN", "", 5},
		{"", "TOKEN", 5},
		{"TOKEN", "TOKEN", 0},
		{"TOKN", "TOKEN", 1},
		{"TOKEN", "TOKENS", 1},
		{"TOKEN", "TOKAN", 1},
		{"TOKNE", "TOKEN", 1},
		{"kitten", "sitting", 3},
		{"ca", "abc", 3}, // each substring edited once: not 2
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
