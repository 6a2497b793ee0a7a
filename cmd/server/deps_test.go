package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// These tests keep what the server links from growing back (issue 14: a
// cold build took minutes). They read the dependency graph with
// `go list -deps`, for the default build (what `go run ./cmd/server`
// links) and for the Docker image's build tags, read from the Dockerfile.
//
// Gin v1.12.0 imports quic-go (http3, for RunQUIC), the MongoDB driver's
// bson and go-toml unconditionally, so they stay in both graphs until Gin
// makes them optional; the README's "Build" note says so. Downgrading to
// v1.10.1, which lacks the first two, would lose Gin's fix for client IPs
// behind several X-Forwarded-For lines (gin-gonic/gin#4472), which the
// issue rate limit and the idempotency IP scope depend on.

// notInServer are modules the default build must not link: test-only
// modules, and JSON libraries Gin can be built with in place of
// encoding/json (token/ uses goccy/go-json for claims: one is enough).
var notInServer = []string{
	"github.com/chromedp/",
	"github.com/alicebob/miniredis/",
	"github.com/yuin/gopher-lua",
	"go.uber.org/goleak",
	"github.com/json-iterator/go",
	"github.com/bytedance/sonic",
}

// notInImage are modules the image's build leaves out with its tags.
var notInImage = []string{
	"github.com/ugorji/go", // Gin's MessagePack codec, out with -tags nomsgpack
}

func TestServerDependencies(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the PATH")
	}
	tags := imageBuildTags(t)

	t.Run("the default build links no test-only module and no third JSON library", func(t *testing.T) {
		deps := serverDeps(t, goCmd, "")
		for _, mod := range notInServer {
			if p := firstWithPrefix(deps, mod); p != "" {
				t.Errorf("./cmd/server links %s (module %s)", p, mod)
			}
		}
	})

	t.Run("the image's build tags leave out Gin's MessagePack codec", func(t *testing.T) {
		if !strings.Contains(","+tags+",", ",nomsgpack,") {
			t.Fatalf("the Dockerfile builds with -tags %q, want nomsgpack among them", tags)
		}
		deps := serverDeps(t, goCmd, tags)
		for _, mod := range append(notInImage, notInServer...) {
			if p := firstWithPrefix(deps, mod); p != "" {
				t.Errorf("./cmd/server built with -tags %s links %s (module %s)", tags, p, mod)
			}
		}
	})

	t.Run("the server compiles with the image's build tags", func(t *testing.T) {
		if testing.Short() {
			t.Skip("compiles the server; skipped with -short")
		}
		cmd := exec.Command(goCmd, "build", "-tags", tags, "-o", filepath.Join(t.TempDir(), "replayguard"), ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build -tags %s ./cmd/server: %v\n%s", tags, err, out)
		}
	})
}

// serverDeps lists the packages ./cmd/server links with the given tags.
func serverDeps(t *testing.T, goCmd, tags string) []string {
	t.Helper()
	args := []string{"list", "-deps"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command(goCmd, append(args, ".")...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

func firstWithPrefix(pkgs []string, prefix string) string {
	for _, p := range pkgs {
		if strings.HasPrefix(p, prefix) {
			return p
		}
	}
	return ""
}

// imageBuildTags returns the -tags of the Dockerfile's go build of
// ./cmd/server.
func imageBuildTags(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(composeRepoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range dockerfileInstructions(string(data))["RUN"] {
		if !strings.Contains(run, "go build") || !strings.Contains(run, "./cmd/server") {
			continue
		}
		f := strings.Fields(run)
		for i, a := range f {
			if v, ok := strings.CutPrefix(a, "-tags="); ok {
				return strings.Trim(v, `"'`)
			}
			if a == "-tags" && i+1 < len(f) {
				return strings.Trim(f[i+1], `"'`)
			}
		}
		return ""
	}
	t.Fatal("the Dockerfile has no go build of ./cmd/server")
	return ""
}
