package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runMain runs this binary's main in a subprocess with args and env
// (NAME=value, added to the test's) and returns its stdout, stderr and
// exit code.
func runMain(t *testing.T, args []string, env ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "REPLAYGUARD_TEST_RUN_MAIN=1")
	cmd.Env = append(cmd.Env, env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestHelpPrintsEveryFlagWithItsType(t *testing.T) {
	stdout, stderr, code := runMain(t, []string{"-h"})
	if code != 0 || stderr != "" {
		t.Fatalf("-h: exit %d, stderr %q; want 0 and nothing on stderr", code, stderr)
	}
	if !strings.HasPrefix(stdout, "Usage: replayguard [flags]\n") {
		t.Fatalf("-h does not begin with the usage header:\n%s", stdout)
	}
	// As Go's flag.PrintDefaults prints a typed flag.
	for _, want := range []string{
		"  -token-ttl duration\n    \tdefault token lifetime, within [10s, max TTL] ($REPLAYGUARD_TOKEN_TTL) (default 5m)\n",
		"  -addr string\n    \tlisten address",
		"  -idempotency-max-body size\n",
		"  -issue-rate rate\n",
		"  -redis-min-replicas int\n",
		`(default "rg:")`,
		"($REPLAYGUARD_API_KEYS or the file $REPLAYGUARD_API_KEYS_FILE)\n",
		"  -healthcheck\n    \tprobe GET /healthz",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("-h lacks %q", want)
		}
	}
	for _, s := range settings {
		line := "\n  -" + s.flag + " " + flagType(s) + "\n    \t" + s.usage + " ($" + s.env
		if !strings.Contains(stdout, line) {
			t.Errorf("-h lacks -%s with its type, usage and variable", s.flag)
		}
	}
	if t.Failed() {
		t.Logf("-h printed:\n%s", stdout)
	}
}

func TestBadCommandLinePrintsUsageAndExits2(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"-nope"}, "flag provided but not defined: -nope"},
		{"flag without its value", []string{"-token-ttl"}, "flag needs an argument: -token-ttl"},
		{"argument that is not a flag", []string{"serve"}, `unexpected argument "serve"`},
		{"bad boolean", []string{"-healthcheck=maybe"}, "invalid boolean value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := runMain(t, tc.args)
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
			if !strings.HasPrefix(stderr, "replayguard: ") || !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr does not begin with the error %q:\n%s", tc.want, stderr)
			}
			if !strings.Contains(stderr, "\nUsage: replayguard [flags]\n") || !strings.Contains(stderr, "  -token-ttl duration\n") {
				t.Errorf("stderr lacks the usage:\n%s", stderr)
			}
		})
	}
}

// TestBadFlagValueIsAConfigurationError: a flag that parses but whose
// value does not is reported as a bad variable is, naming the flag, as
// one JSON line with exit 1, never quoting a secret.
func TestBadFlagValueIsAConfigurationError(t *testing.T) {
	stdout, _, code := runMain(t, []string{"-token-ttl", "soon", "-addr", "127.0.0.1:0"})
	if code != 1 || !strings.Contains(stdout, "-token-ttl") || !strings.Contains(stdout, `"level":"ERROR"`) {
		t.Fatalf("exit %d, stdout %s", code, stdout)
	}
}

func TestFlagTypes(t *testing.T) {
	envs := map[string]bool{}
	for _, s := range settings {
		envs[s.env] = true
		typ := flagType(s)
		if _, err := time.ParseDuration(s.def); err == nil && s.def != "0" && typ != "duration" {
			t.Errorf("%s defaults to %s but its flag is a %s", s.env, s.def, typ)
		}
		if _, err := strconv.Atoi(s.def); err == nil && s.def != "0" && typ != "int" {
			t.Errorf("%s defaults to %s but its flag is a %s", s.env, s.def, typ)
		}
	}
	for env := range flagTypes {
		if !envs[env] {
			t.Errorf("flagTypes names %s, which is no setting", env)
		}
	}
}

// TestFlagVariableFileDefault: a flag wins over its variable, the
// variable over its _FILE, and the file over the default.
func TestFlagVariableFileDefault(t *testing.T) {
	file := filepath.Join(t.TempDir(), "api-keys")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"flag over variable", []string{"-api-keys", "from-flag"}, map[string]string{"REPLAYGUARD_API_KEYS": "from-env", "REPLAYGUARD_API_KEYS_FILE": file}, "from-flag"},
		{"variable over file", nil, map[string]string{"REPLAYGUARD_API_KEYS": "from-env", "REPLAYGUARD_API_KEYS_FILE": file}, "from-env"},
		{"file over default", nil, map[string]string{"REPLAYGUARD_API_KEYS_FILE": file}, "from-file"},
		{"default", nil, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(c.APIKeys, ","); got != tc.want {
				t.Errorf("API keys = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSecretFileBounded: a *_FILE over maxSecretFile (a wrong path: a
// log, a device) is a configuration error naming the variable and the
// file, read no further than the bound.
func TestSecretFileBounded(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "signing-keys")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), maxSecretFile+1), 0o600); err != nil {
		t.Fatal(err)
	}
	atBound := filepath.Join(dir, "api-keys")
	if err := os.WriteFile(atBound, append([]byte("key"), bytes.Repeat([]byte(" "), maxSecretFile-3)...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, env, file, wantErr string
	}{
		{"over the bound", "REPLAYGUARD_SIGNING_KEYS_FILE", big, "REPLAYGUARD_SIGNING_KEYS_FILE: " + big + " is over 1048576 bytes"},
		{"at the bound", "REPLAYGUARD_API_KEYS_FILE", atBound, ""},
		{"missing", "REPLAYGUARD_API_KEYS_FILE", filepath.Join(dir, "nosuch"), "REPLAYGUARD_API_KEYS_FILE: open " + filepath.Join(dir, "nosuch")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(nil, func(k string) string {
				if k == tc.env {
					return tc.file
				}
				return ""
			})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("loadConfig: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.wantErr)):
				t.Fatalf("loadConfig = %v, want an error starting %q", err, tc.wantErr)
			}
		})
	}
}

// TestListenAddress: without REPLAYGUARD_ADDR, a server with neither
// signing keys nor API keys (the development setup) listens on loopback
// only; with either, on every interface; REPLAYGUARD_ADDR always wins.
func TestListenAddress(t *testing.T) {
	signing := "REPLAYGUARD_SIGNING_KEYS=k1:" + strings.Repeat("QUJD", 11)
	keyFile := filepath.Join(t.TempDir(), "api-keys")
	if err := os.WriteFile(keyFile, []byte("backend-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		env      []string
		want     string
		loopback bool
	}{
		{"no keys: loopback only", nil, nil, "127.0.0.1:8080", true},
		{"auto is the same", nil, []string{"REPLAYGUARD_ADDR=auto"}, "127.0.0.1:8080", true},
		{"signing keys: every interface", nil, []string{signing}, ":8080", false},
		{"API keys: every interface", nil, []string{"REPLAYGUARD_API_KEYS=backend-key"}, ":8080", false},
		{"API keys from a file: every interface", nil, []string{"REPLAYGUARD_API_KEYS_FILE=" + keyFile}, ":8080", false},
		{"the variable wins", nil, []string{"REPLAYGUARD_ADDR=:9090"}, ":9090", false},
		{"the flag wins", []string{"-addr", "0.0.0.0:8081"}, []string{"REPLAYGUARD_ADDR=:9090"}, "0.0.0.0:8081", false},
		{"keys and a loopback address", nil, []string{signing, "REPLAYGUARD_ADDR=127.0.0.1:8080"}, "127.0.0.1:8080", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
			c, err := loadConfig(tc.args, func(k string) string { return env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if c.Addr != tc.want || c.LoopbackOnly != tc.loopback {
				t.Errorf("addr %q, loopback only %v; want %q, %v", c.Addr, c.LoopbackOnly, tc.want, tc.loopback)
			}
		})
	}
}

// TestDevelopmentServerSaysItListensOnLoopback runs the server with no
// REPLAYGUARD_ADDR and no keys: it listens on 127.0.0.1:8080 and its start
// line says so, and why.
func TestDevelopmentServerSaysItListensOnLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", devAddr)
	if err != nil {
		t.Skipf("%s is taken on this machine: %v", devAddr, err)
	}
	ln.Close()
	_, addr, out := server(t, "REPLAYGUARD_ADDR=") // empty: unset
	if addr != devAddr {
		t.Fatalf("listening on %s, want %s", addr, devAddr)
	}
	rec := out.waitForLog(t, 0, "replayguard listening")
	if rec["loopback_only"] != true || !strings.Contains(rec["why"].(string), "REPLAYGUARD_ADDR") {
		t.Fatalf("start line = %v, want loopback_only and why", rec)
	}
}
