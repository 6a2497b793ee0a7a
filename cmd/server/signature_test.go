package main

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/replayguard/replayguard/replay"
)

// hmacSecret is a fresh 32-byte client secret.
func hmacSecret(t *testing.T) []byte {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// writeClientKeys writes a client keys file holding one hmac-sha256 key.
func writeClientKeys(t *testing.T, path, id string, secret []byte) {
	t.Helper()
	data := fmt.Sprintf(`{"keys": [{"id": %q, "alg": "hmac-sha256", "secret": %q, "label": "test"}]}`, id, base64.StdEncoding.EncodeToString(secret))
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// verifyWith signs a request with the key id and secret, using the Go
// signer clients use, and asks the server at addr to verify it. It
// returns the status and problem code ("" on success). It never fails
// the test, so goroutines may call it.
func verifyWith(addr, id string, secret []byte) (int, string, error) {
	signer, err := replay.NewSigner(id, replay.AlgHMACSHA256, secret)
	if err != nil {
		return 0, "", err
	}
	body := []byte(`{"item":"book"}`)
	req, err := http.NewRequest(http.MethodPost, "https://api.example.com/v1/orders?id=7", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if err := signer.Sign(req); err != nil {
		return 0, "", err
	}
	headers := map[string]string{}
	for name := range req.Header {
		headers[name] = req.Header.Get(name)
	}
	payload, err := json.Marshal(map[string]any{
		"method": req.Method, "url": req.URL.String(), "headers": headers,
		"body": base64.StdEncoding.EncodeToString(body),
	})
	if err != nil {
		return 0, "", err
	}
	resp, err := http.Post("http://"+addr+"/v1/signatures/verify", "application/json", bytes.NewReader(payload))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", err
	}
	var out map[string]any // a verified body or a problem
	if err := json.Unmarshal(raw, &out); err != nil {
		return 0, "", fmt.Errorf("%w: %s", err, raw)
	}
	if resp.StatusCode == http.StatusOK && (out["status"] != "verified" || out["keyid"] != id) {
		return 0, "", fmt.Errorf("200 with body %s", raw)
	}
	code, _ := out["code"].(string)
	return resp.StatusCode, code, nil
}

// wantVerify requires verifyWith to answer status and code.
func wantVerify(t *testing.T, addr, id string, secret []byte, status int, code string) {
	t.Helper()
	got, gotCode, err := verifyWith(addr, id, secret)
	if err != nil {
		t.Fatalf("verify with %s: %v", id, err)
	}
	if got != status || gotCode != code {
		t.Fatalf("verify with %s = %d %q, want %d %q", id, got, gotCode, status, code)
	}
}

func TestClientKeysReloadOnSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client-keys.json")
	secretA, secretB := hmacSecret(t), hmacSecret(t)
	writeClientKeys(t, path, "key-a", secretA)
	cmd, addr, out := server(t, "REPLAYGUARD_CLIENT_KEYS="+path)

	loaded := out.waitForLog(t, 0, "client keys loaded")
	if loaded["keys"] != 1.0 || loaded["replay_window"] != "5m0s" {
		t.Errorf("start log = %v, want 1 key and the 5m window", loaded)
	}
	out.waitForLog(t, 0, "signed requests on the embedded memory store: signatures created before the process started are refused as signature_expired, since the nonces seen before a restart are gone")
	wantVerify(t, addr, "key-a", secretA, http.StatusOK, "")
	wantVerify(t, addr, "key-b", secretB, http.StatusUnauthorized, "signature_invalid")

	t.Run("a new file is in force after SIGHUP, and requests are served throughout", func(t *testing.T) {
		writeClientKeys(t, path, "key-b", secretB)
		// Requests keep flowing while the keys are swapped.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var errs []error
		var mu sync.Mutex
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				status, _, err := verifyWith(addr, "key-b", secretB)
				if err == nil && status != http.StatusOK && status != http.StatusUnauthorized {
					err = fmt.Errorf("status %d during the reload", status)
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
		n := out.count()
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		rec := out.waitForLog(t, n, "client keys reloaded")
		close(stop)
		wg.Wait()
		if len(errs) > 0 {
			t.Errorf("requests failed during the reload: %v", errs)
		}
		if rec["keys"] != 1.0 {
			t.Errorf("reload log = %v, want 1 key", rec)
		}
		wantVerify(t, addr, "key-b", secretB, http.StatusOK, "")
		wantVerify(t, addr, "key-a", secretA, http.StatusUnauthorized, "signature_invalid")
	})

	t.Run("a malformed file keeps the keys in force and the log says why without secrets", func(t *testing.T) {
		leaked := base64.StdEncoding.EncodeToString(hmacSecret(t))
		for _, bad := range []string{
			`{"keys": [{"id": "key-c", "alg": "hmac-sha256", "secret": "` + leaked + `"`,         // cut short
			`{"keys": [{"id": "key-c", "alg": "hmac-sha256", "secret": "` + leaked[:20] + `"}]}`, // too short a secret
			`{"keys": [{"id": "key-c", "alg": "hmac-sha256", "secret": "` + leaked + `", "extra": 1}]}`,
		} {
			if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
				t.Fatal(err)
			}
			n := out.count()
			if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			rec := out.waitForLog(t, n, "client keys not reloaded: keeping the keys in force")
			if e, _ := rec["error"].(string); !strings.Contains(e, "client keys") || rec["keys"] != 1.0 {
				t.Errorf("reload failure log = %v, want the reason and the 1 key in force", rec)
			}
			wantVerify(t, addr, "key-b", secretB, http.StatusOK, "")
		}
		logs := out.String()
		for _, secret := range []string{leaked, leaked[:20], base64.StdEncoding.EncodeToString(secretA), base64.StdEncoding.EncodeToString(secretB)} {
			if strings.Contains(logs, secret) {
				t.Fatalf("a secret was logged:\n%s", logs)
			}
		}
	})

	t.Run("a deleted file keeps the keys in force", func(t *testing.T) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		n := out.count()
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		out.waitForLog(t, n, "client keys not reloaded: keeping the keys in force")
		wantVerify(t, addr, "key-b", secretB, http.StatusOK, "")
	})
}

func TestSignedRequestsNeedClientKeys(t *testing.T) {
	_, addr, _ := server(t)
	resp, err := http.Post("http://"+addr+"/v1/signatures/verify", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("verify without REPLAYGUARD_CLIENT_KEYS = %d, want 404", resp.StatusCode)
	}
}

func TestBadClientKeysExitNonZero(t *testing.T) {
	dir := t.TempDir()
	secret := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("s", 16)))
	malformed := filepath.Join(dir, "malformed.json")
	if err := os.WriteFile(malformed, []byte(`{"keys": [{"id": "k", "alg": "hmac-sha256", "secret": "`+secret+`"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, env, want string }{
		{"malformed keys file", "REPLAYGUARD_CLIENT_KEYS=" + malformed, "REPLAYGUARD_CLIENT_KEYS"},
		{"missing keys file", "REPLAYGUARD_CLIENT_KEYS=" + filepath.Join(dir, "absent.json"), "REPLAYGUARD_CLIENT_KEYS"},
		{"bad window", "REPLAYGUARD_REPLAY_WINDOW=5 minutes", "REPLAYGUARD_REPLAY_WINDOW"},
		{"zero window", "REPLAYGUARD_REPLAY_WINDOW=0s", "REPLAYGUARD_REPLAY_WINDOW"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "REPLAYGUARD_TEST_RUN_MAIN=1", "REPLAYGUARD_ADDR=127.0.0.1:0", tc.env)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("exit = %v, want non-zero; output %s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("message does not name %s: %s", tc.want, out)
			}
			if strings.Contains(string(out), secret) {
				t.Fatalf("the message quotes the secret: %s", out)
			}
			if strings.Contains(string(out), "replayguard listening") {
				t.Fatalf("the server started: %s", out)
			}
		})
	}
}
