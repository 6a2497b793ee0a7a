package replayguard_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// readmeImports are the packages every README Go block may use without
// importing them, by the name the README calls them.
var readmeImports = map[string]string{
	"bytes":       "bytes",
	"context":     "context",
	"errors":      "errors",
	"os":          "os",
	"http":        "net/http",
	"strings":     "strings",
	"time":        "time",
	"gin":         "github.com/gin-gonic/gin",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"gateway":     "github.com/replayguard/replayguard/gateway",
	"guard":       "github.com/replayguard/replayguard/guard",
	"handlers":    "github.com/replayguard/replayguard/handlers",
	"idempotency": "github.com/replayguard/replayguard/idempotency",
	"pgtx":        "github.com/replayguard/replayguard/idempotency/pgtx",
	"metrics":     "github.com/replayguard/replayguard/metrics",
	"problem":     "github.com/replayguard/replayguard/problem",
	"replay":      "github.com/replayguard/replayguard/replay",
	"store":       "github.com/replayguard/replayguard/store",
	"memory":      "github.com/replayguard/replayguard/store/memory",
	"postgres":    "github.com/replayguard/replayguard/store/postgres",
	"redis":       "github.com/replayguard/replayguard/store/redis",
	"storetest":   "github.com/replayguard/replayguard/store/storetest",
	"token":       "github.com/replayguard/replayguard/token",
	"sdk":         "github.com/replayguard/replayguard/web/sdk",
	"webhook":     "github.com/replayguard/replayguard/webhook",
	"testenv":     "github.com/replayguard/replayguard/internal/testenv",
}

// readmePrelude declares the names README Go blocks use without declaring
// them: the application's own handlers, its store, its router. A block
// may declare any of them again.
const readmePrelude = `package readme

import (
	"context"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
)

var (
	ctx                                    context.Context
	st                                     store.Store
	keys                                   []token.Key
	svc, tokens                            *token.Service
	keeper                                 *idempotency.Keeper
	mux                                    *http.ServeMux
	r                                      *gin.Engine
	c                                      *gin.Context
	req                                    *http.Request
	checkoutHandler, createOrderHandler    http.Handler
	orders, billing                        http.Handler
	checkoutGin, createOrder, fulfilGin    gin.HandlerFunc
	msg                                    struct{ ID string }
	fingerprint, secret, endpoint, eventID string
	payload                                []byte
)
`

// readmeBlock is a fenced Go block of README.md.
type readmeBlock struct {
	line int // of its first line of code
	code []string
}

// readmeGo returns README.md's Go blocks and the text outside them.
func readmeGo(t *testing.T) (blocks []readmeBlock, prose map[int]string) {
	t.Helper()
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cur *readmeBlock
	fenced := false
	prose = map[int]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks, cur = append(blocks, *cur), nil
		case cur != nil:
			cur.code = append(cur.code, line)
		case strings.HasPrefix(line, "```go"):
			cur = &readmeBlock{line: n + 1}
		case strings.HasPrefix(line, "```"):
			fenced = !fenced
		case !fenced:
			prose[n] = line
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("README.md:%d: unterminated go block", cur.line-1)
	}
	return blocks, prose
}

var quoted = regexp.MustCompile(`"([^"]+)"`)

// source turns a block into a file of package readme: its import
// declaration and the functions it declares at the left margin stay at
// top level, every other line becomes the body of a function, and a line
// that is only "…" (code left out) is dropped. Every package of
// readmeImports is imported besides the block's own imports. The file's
// line directive points at README.md, so errors name the README's lines.
func (b readmeBlock) source() string {
	var imports, funcs, body strings.Builder
	own := map[string]bool{}
	top := &body
	for i, line := range b.code {
		directive := fmt.Sprintf("//line README.md:%d\n", b.line+i)
		switch {
		case strings.TrimSpace(line) == "…":
			continue
		case strings.HasPrefix(line, "import"):
			top = &imports
		case strings.HasPrefix(line, "func "):
			top = &funcs
		}
		if top == &imports {
			if m := quoted.FindStringSubmatch(line); m != nil {
				own[m[1]] = true
			}
		}
		top.WriteString(directive + line + "\n")
		if (top == &imports && strings.HasPrefix(line, ")")) ||
			(top == &imports && strings.HasPrefix(line, "import \"")) ||
			(top == &funcs && line == "}") {
			top = &body
		}
	}
	var src strings.Builder
	src.WriteString("package readme\n\nimport (\n")
	for _, path := range slices.Sorted(maps.Values(readmeImports)) {
		if !own[path] {
			fmt.Fprintf(&src, "\t%q\n", path)
		}
	}
	src.WriteString(")\n\n" + imports.String() + "\nfunc _() {\n" + body.String() + "}\n\n" + funcs.String())
	return src.String()
}

// exportData builds the export data of paths and their dependencies with
// the go command (from its cache when nothing changed), and returns an
// importer that reads it.
func exportData(t *testing.T, fset *token.FileSet, paths []string) types.Importer {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, paths...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.Bytes())
	}
	files := map[string]string{}
	for line := range strings.Lines(string(out)) {
		path, file, _ := strings.Cut(strings.TrimSpace(line), "\t")
		files[path] = file
	}
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if files[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(files[path])
	})
}

// TestReadmeGoBlocks type-checks every Go block of README.md against the
// packages of this module, so that the README cannot drift from the API.
// A block is a fragment of a program: it may use the names readmePrelude
// declares and the packages of readmeImports, and leave variables and
// imports unused. Names such as `guard.WithScope` in the README's text
// must exist too.
func TestReadmeGoBlocks(t *testing.T) {
	blocks, prose := readmeGo(t)
	if len(blocks) == 0 {
		t.Fatal("README.md has no go blocks")
	}
	fset := token.NewFileSet()
	prelude, err := parser.ParseFile(fset, "readme_prelude.go", readmePrelude, 0)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	paths := slices.Collect(maps.Values(readmeImports))
	for _, b := range blocks {
		f, err := parser.ParseFile(fset, "", b.source(), parser.SkipObjectResolution)
		if err != nil {
			t.Errorf("README.md:%d: go block does not parse: %v", b.line-1, err)
			continue
		}
		files = append(files, f)
		for _, s := range f.Imports {
			path, _ := strconv.Unquote(s.Path.Value)
			paths = append(paths, path)
		}
	}
	imp := exportData(t, fset, paths)

	for _, f := range files {
		conf := types.Config{Importer: imp, Error: func(err error) {
			if msg := err.Error(); !strings.Contains(msg, "declared and not used") && !strings.Contains(msg, "imported and not used") {
				t.Error(msg)
			}
		}}
		conf.Check("readme", fset, []*ast.File{prelude, f}, nil) // errors go to conf.Error
	}

	// Names in the text: `pkg.Name` and `pkg.Type.Method` where pkg is
	// a package of readmeImports.
	pkgs := map[string]*types.Package{}
	for name, path := range readmeImports {
		if pkgs[name], err = imp.Import(path); err != nil {
			t.Fatal(err)
		}
	}
	ref := regexp.MustCompile("`([a-z]+)\\.([A-Z][A-Za-z0-9_]*)(?:\\.([A-Z][A-Za-z0-9_]*))?")
	for _, n := range slices.Sorted(maps.Keys(prose)) {
		line := prose[n]
		for _, m := range ref.FindAllStringSubmatch(line, -1) {
			pkg := pkgs[m[1]]
			if pkg == nil || strings.HasPrefix(m[2], "Example") {
				continue
			}
			obj := pkg.Scope().Lookup(m[2])
			switch {
			case obj == nil:
				t.Errorf("README.md:%d: %s.%s does not exist", n, m[1], m[2])
			case m[3] != "":
				if o, _, _ := types.LookupFieldOrMethod(types.NewPointer(obj.Type()), true, pkg, m[3]); o == nil {
					t.Errorf("README.md:%d: %s.%s.%s does not exist", n, m[1], m[2], m[3])
				}
			}
		}
	}
}
