package main

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
)

// These tests keep the deployment files and the README in step with the
// settings table, without a Docker engine: every variable docker-compose.yml
// sets is one the server reads, the values it sets load, the service builds
// from the Dockerfile that exists, and README.md documents every variable
// with its flag and default.

// composeRepoRoot is the repository root, relative to this package's directory.
const composeRepoRoot = "../.."

// composeFile is the part of docker-compose.yml the tests read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Secrets  map[string]composeSecret  `yaml:"secrets"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string         `yaml:"image"`
	Build       any            `yaml:"build"`
	Command     []string       `yaml:"command"`
	Environment any            `yaml:"environment"`
	Secrets     []string       `yaml:"secrets"`
	Ports       []any          `yaml:"ports"`
	Volumes     []string       `yaml:"volumes"`
	DependsOn   any            `yaml:"depends_on"`
	Healthcheck map[string]any `yaml:"healthcheck"`
}

func loadCompose(t *testing.T) composeFile { return loadComposeFile(t, "docker-compose.yml") }

// loadComposeFile reads the compose file name at the repository's root.
func loadComposeFile(t *testing.T, name string) composeFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(composeRepoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return f
}

// TestComposePostgresOverride checks docker-compose.postgres.yml: merged
// over docker-compose.yml, as compose merges environments and secrets,
// the server loads its environment and runs on the postgres service, and
// the database's password too comes from a secret file.
func TestComposePostgresOverride(t *testing.T) {
	base, override := loadCompose(t), loadComposeFile(t, "docker-compose.postgres.yml")
	pg, ok := override.Services["postgres"]
	if !ok {
		t.Fatal("docker-compose.postgres.yml has no postgres service")
	}
	env, err := composeEnvironment(base.Services["replayguard"].Environment)
	if err != nil {
		t.Fatal(err)
	}
	over, err := composeEnvironment(override.Services["replayguard"].Environment)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(env, over)
	defined := maps.Clone(base.Secrets)
	maps.Copy(defined, override.Secrets)
	mounted := append(slices.Clone(base.Services["replayguard"].Secrets), override.Services["replayguard"].Secrets...)
	cfg, err := composeServerConfig(t, env, mounted, defined)
	if err != nil {
		t.Fatalf("the merged environment does not load: %v", err)
	}
	if !strings.Contains(cfg.PostgresURL, "@postgres:5432/") || cfg.RedisURL != nil {
		t.Fatalf("the merged service does not run on the postgres service alone: %q, %v", cfg.PostgresURL, cfg.RedisURL)
	}
	pgEnv, err := composeEnvironment(pg.Environment)
	if err != nil {
		t.Fatal(err)
	}
	if _, inline := pgEnv["POSTGRES_PASSWORD"]; inline || composeLiteral(pgEnv, "POSTGRES_PASSWORD_FILE") != "/run/secrets/postgres_password" ||
		!slices.Contains(pg.Secrets, "postgres_password") || defined["postgres_password"].File == "" {
		t.Errorf("the postgres service does not read its password from the postgres_password secret file: %v, secrets %v", pgEnv, pg.Secrets)
	}
}

// composeSecret is a top-level secret of a compose file.
type composeSecret struct {
	File string `yaml:"file"`
}

// composeSecretValues are what an operator writes into ./secrets, by
// secret name.
var composeSecretValues = map[string]string{
	"signing_keys":      "2026-01:" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32))),
	"api_keys":          "backend-key",
	"postgres_password": "pw",
	"postgres_url":      "postgres://replayguard:pw@postgres:5432/replayguard?sslmode=disable",
}

// composeSecretsDir is where compose mounts a service's secrets.
const composeSecretsDir = "/run/secrets/"

// composeServerConfig loads the server's configuration from a service's
// environment env as its container sees it: each /run/secrets/NAME is
// the secret NAME, which the service must mount (mounted) and the file
// define with a file (defined); it reads composeSecretValues[NAME] from a
// temporary file instead.
func composeServerConfig(t *testing.T, env map[string]*string, mounted []string, defined map[string]composeSecret) (*config, error) {
	t.Helper()
	dir := t.TempDir()
	vals := map[string]string{}
	for name, v := range env {
		if v == nil {
			t.Errorf("%s is passed through from the host: set it, or mount a secret", name)
			continue
		}
		val, err := composeInterpolate(*v, nil)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if secret, ok := strings.CutPrefix(val, composeSecretsDir); ok {
			if !slices.Contains(mounted, secret) || defined[secret].File == "" {
				t.Errorf("%s reads secret %q, which the service does not mount from a file", name, secret)
			}
			val = filepath.Join(dir, secret)
			if err := os.WriteFile(val, []byte(composeSecretValues[secret]+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		vals[name] = val
	}
	return loadConfig(nil, func(name string) string { return vals[name] })
}

// composeEnvironment reads a service's environment in either of Compose's
// forms: a map of NAME: value, or a list of "NAME=value" (or bare "NAME",
// passed through from the host). A nil value means "from the host".
func composeEnvironment(v any) (map[string]*string, error) {
	env := map[string]*string{}
	switch e := v.(type) {
	case nil:
	case map[string]any:
		for name, val := range e {
			if val == nil {
				env[name] = nil
				continue
			}
			s := fmt.Sprint(val)
			env[name] = &s
		}
	case []any:
		for _, item := range e {
			s, ok := item.(string)
			if !ok {
				return nil, fmt.Errorf("environment entry %v is not a string", item)
			}
			name, val, ok := strings.Cut(s, "=")
			if !ok {
				env[name] = nil
				continue
			}
			env[name] = &val
		}
	default:
		return nil, fmt.Errorf("environment is a %T, want a map or a list", v)
	}
	return env, nil
}

func TestComposeEnvironmentForms(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want map[string]string // "<host>" for a value passed through
	}{
		{"map form", "environment:\n  A: x\n  B: \"1\"\n  C:\n", map[string]string{"A": "x", "B": "1", "C": "<host>"}},
		{"list form", "environment:\n  - A=x\n  - B=a=b\n  - C\n", map[string]string{"A": "x", "B": "a=b", "C": "<host>"}},
		{"no environment", "image: x\n", map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s composeService
			if err := yaml.Unmarshal([]byte(tt.yaml), &s); err != nil {
				t.Fatal(err)
			}
			env, err := composeEnvironment(s.Environment)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for k, v := range env {
				got[k] = "<host>"
				if v != nil {
					got[k] = *v
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// composeInterpolation is Compose's ${NAME}, ${NAME:-default} and ${NAME:?error}.
var composeInterpolation = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}`)

// composeInterpolate resolves v as Compose would with the host environment host.
func composeInterpolate(v string, host map[string]string) (string, error) {
	var err error
	out := composeInterpolation.ReplaceAllStringFunc(v, func(m string) string {
		p := composeInterpolation.FindStringSubmatch(m)
		name, op, arg := p[1], p[2], p[3]
		val, set := host[name]
		switch {
		case set && (val != "" || !strings.HasPrefix(op, ":")):
			return val
		case strings.HasSuffix(op, "-"):
			return arg
		case strings.HasSuffix(op, "?"):
			err = fmt.Errorf("%s is required (%s)", name, arg)
		}
		return ""
	})
	return out, err
}

func TestComposeReplayguardService(t *testing.T) {
	f := loadCompose(t)
	svc, ok := f.Services["replayguard"]
	if !ok {
		t.Fatal("docker-compose.yml has no replayguard service")
	}
	env, err := composeEnvironment(svc.Environment)
	if err != nil {
		t.Fatal(err)
	}
	if len(env) == 0 {
		t.Fatal("the replayguard service sets no environment")
	}

	t.Run("sets only variables the server reads", func(t *testing.T) {
		known := envNames()
		for name := range env {
			if !slices.Contains(known, name) {
				t.Errorf("docker-compose.yml sets %s, which the server does not read", name)
			}
		}
	})

	t.Run("its values load", func(t *testing.T) {
		cfg, err := composeServerConfig(t, env, svc.Secrets, f.Secrets)
		if err != nil {
			t.Fatalf("the compose environment does not load: %v", err)
		}
		if cfg.RedisURL == nil || cfg.RedisURL.Addr != "redis:6379" {
			t.Errorf("the service does not use the redis service: %+v", cfg.RedisURL)
		}
		if len(cfg.SigningKeys) == 0 || len(cfg.APIKeys) == 0 {
			t.Error("the service runs without signing keys or API keys")
		}
		if cfg.MachineID == nil {
			t.Error("the service sets no REPLAYGUARD_MACHINE_ID")
		}
	})

	t.Run("secrets come from secret files, never the environment", func(t *testing.T) {
		// A URL without a password (redis://redis:6379/0) holds no secret.
		for _, s := range settings {
			v := env[s.env]
			if !s.secret || v == nil || *v == "" {
				continue
			}
			if u, err := url.Parse(*v); err != nil || u.Scheme == "" || u.User != nil {
				t.Errorf("%s is set in the environment, where docker inspect shows it: mount it as a secret and set %s_FILE", s.env, s.env)
			}
		}
		for _, name := range []string{"REPLAYGUARD_SIGNING_KEYS_FILE", "REPLAYGUARD_API_KEYS_FILE"} {
			if !strings.HasPrefix(composeLiteral(env, name), composeSecretsDir) {
				t.Errorf("%s = %q, want a file in %s", name, composeLiteral(env, name), composeSecretsDir)
			}
		}
		for name, sec := range f.Secrets {
			if !strings.HasPrefix(sec.File, "./secrets/") {
				t.Errorf("secret %s is read from %q, want a file in ./secrets, which .gitignore and .dockerignore keep out", name, sec.File)
			}
		}
		for _, ignore := range []string{".gitignore", ".dockerignore"} {
			data, err := os.ReadFile(filepath.Join(composeRepoRoot, ignore))
			if err != nil || !regexp.MustCompile(`(?m)^/?secrets/$`).Match(data) {
				t.Errorf("%s does not ignore secrets/ (%v)", ignore, err)
			}
		}
	})

	t.Run("publishes on loopback only", func(t *testing.T) {
		if len(svc.Ports) == 0 {
			t.Fatal("no ports published")
		}
		for _, p := range svc.Ports {
			if s := fmt.Sprint(p); !strings.HasPrefix(s, "127.0.0.1:") {
				t.Errorf("port %q is published on every interface of the host, want 127.0.0.1:...", s)
			}
		}
	})

	t.Run("healthcheck runs the binary's probe", func(t *testing.T) {
		checkComposeHealthcheck(t, svc)
	})

	t.Run("builds from the Dockerfile that exists", func(t *testing.T) {
		buildContext, dockerfile := ".", "Dockerfile"
		switch b := svc.Build.(type) {
		case string:
			buildContext = b
		case map[string]any:
			if c, ok := b["context"].(string); ok {
				buildContext = c
			}
			if d, ok := b["dockerfile"].(string); ok {
				dockerfile = d
			}
		default:
			t.Fatalf("the replayguard service has build %v, want a build context", svc.Build)
		}
		path := filepath.Join(composeRepoRoot, buildContext, dockerfile)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("the service builds from %s: %v", path, err)
		}
		df := dockerfileInstructions(string(data))
		if !slices.ContainsFunc(df["RUN"], func(s string) bool { return strings.Contains(s, "./cmd/server") }) {
			t.Error("the Dockerfile does not build ./cmd/server")
		}
		if len(df["USER"]) == 0 || slices.ContainsFunc(df["USER"], func(s string) bool { return s == "root" || strings.HasPrefix(s, "0") }) {
			t.Errorf("the Dockerfile runs as %v, want a non-root user", df["USER"])
		}
		port := composeContainerPort(t, composeLiteral(env, "REPLAYGUARD_ADDR"))
		if !slices.Contains(df["EXPOSE"], port) {
			t.Errorf("the Dockerfile exposes %v, want the server's port %s", df["EXPOSE"], port)
		}
		// Without keys the server would listen on the container's
		// loopback only, out of reach.
		if !slices.Contains(df["ENV"], "REPLAYGUARD_ADDR=:8080") {
			t.Errorf("the Dockerfile's ENV %v does not set REPLAYGUARD_ADDR=:8080", df["ENV"])
		}
		if len(df["ENTRYPOINT"]) != 1 || df["ENTRYPOINT"][0] != `["/replayguard"]` {
			t.Errorf("ENTRYPOINT %v, want [\"/replayguard\"], which the healthchecks run", df["ENTRYPOINT"])
		}
		if len(df["HEALTHCHECK"]) != 1 || !strings.HasSuffix(df["HEALTHCHECK"][0], `CMD ["/replayguard", "-healthcheck"]`) {
			t.Errorf("HEALTHCHECK %v, want the binary's -healthcheck", df["HEALTHCHECK"])
		}
	})

	t.Run("publishes the port the server listens on", func(t *testing.T) {
		port := composeContainerPort(t, composeLiteral(env, "REPLAYGUARD_ADDR"))
		var published []string
		for _, p := range svc.Ports {
			s := fmt.Sprint(p)
			published = append(published, s[strings.LastIndex(s, ":")+1:])
		}
		if !slices.Contains(published, port) {
			t.Errorf("ports %v do not publish the server's port %s", svc.Ports, port)
		}
	})

	t.Run("redis keeps its data and never evicts", func(t *testing.T) {
		r := f.Services["redis"]
		cmd := strings.Join(r.Command, " ")
		for _, want := range []string{"--maxmemory-policy noeviction", "--appendonly yes", "--maxmemory "} {
			if !strings.Contains(cmd, want) {
				t.Errorf("redis command %q lacks %s", cmd, want)
			}
		}
		if !slices.ContainsFunc(r.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/data") }) {
			t.Errorf("redis volumes %v: want a volume on /data, where the AOF lives", r.Volumes)
		}
	})

	t.Run("waits for a healthy redis", func(t *testing.T) {
		deps, _ := svc.DependsOn.(map[string]any)
		redis, _ := deps["redis"].(map[string]any)
		if redis["condition"] != "service_healthy" {
			t.Errorf("depends_on = %v, want redis with condition service_healthy", svc.DependsOn)
		}
		if r, ok := f.Services["redis"]; !ok || r.Healthcheck == nil {
			t.Error("the redis service has no healthcheck")
		}
	})
}

// checkComposeHealthcheck checks that svc's healthcheck runs the
// binary's -healthcheck with a timeout above the probe's own.
func checkComposeHealthcheck(t *testing.T, svc composeService) {
	t.Helper()
	hc := svc.Healthcheck
	if got := fmt.Sprint(hc["test"]); got != "[CMD /replayguard -healthcheck]" {
		t.Errorf("healthcheck test = %s, want [CMD /replayguard -healthcheck]", got)
	}
	timeout, err := time.ParseDuration(fmt.Sprint(hc["timeout"]))
	if err != nil || timeout <= healthcheckTimeout {
		t.Errorf("healthcheck timeout %v, want a duration above the probe's %v", hc["timeout"], healthcheckTimeout)
	}
}

// composeLiteral returns the literal value env sets for name, or "" (the default).
func composeLiteral(env map[string]*string, name string) string {
	if v := env[name]; v != nil {
		return *v
	}
	return ""
}

// composeContainerPort is the port of a listen address; empty means the default.
func composeContainerPort(t *testing.T, addr string) string {
	t.Helper()
	if addr == "" {
		addr = composeSettingDefault(t, "REPLAYGUARD_ADDR")
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("REPLAYGUARD_ADDR %q: %v", addr, err)
	}
	return port
}

func composeSettingDefault(t *testing.T, env string) string {
	t.Helper()
	for _, s := range settings {
		if s.env == env {
			return s.def
		}
	}
	t.Fatalf("no setting %s", env)
	return ""
}

// dockerfileInstructions maps each instruction to its arguments, one entry
// per occurrence (continuation lines joined).
func dockerfileInstructions(src string) map[string][]string {
	out := map[string][]string{}
	var line string
	sc := bufio.NewScanner(strings.NewReader(src))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || (l == "" && line == "") {
			continue
		}
		if cont, ok := strings.CutSuffix(l, `\`); ok {
			line += cont + " "
			continue
		}
		line += l
		instr, args, _ := strings.Cut(strings.TrimSpace(line), " ")
		instr = strings.ToUpper(instr)
		if instr == "EXPOSE" {
			for _, p := range strings.Fields(args) {
				p, _, _ = strings.Cut(p, "/")
				out[instr] = append(out[instr], p)
			}
		} else {
			out[instr] = append(out[instr], strings.TrimSpace(args))
		}
		line = ""
	}
	return out
}

// readmeConfigRows returns the rows of README.md's configuration table
// (REPLAYGUARD_* and OTEL_*), keyed by variable: [flag, default,
// meaning], with backticks removed and "—" read as empty.
func readmeConfigRows(t *testing.T) map[string][3]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(composeRepoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Configuration\n")
	if !ok {
		t.Fatal(`README.md has no "## Configuration" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string][3]string{}
	for _, l := range strings.Split(section, "\n") {
		if !strings.HasPrefix(l, "| `REPLAYGUARD_") && !strings.HasPrefix(l, "| `OTEL_") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "| "), " | ")
		if len(cells) != 4 {
			t.Errorf("README.md configuration row has %d cells, want 4: %s", len(cells), l)
			continue
		}
		for i, c := range cells {
			c = strings.Trim(strings.TrimSpace(c), "`")
			if c == "—" {
				c = ""
			}
			cells[i] = c
		}
		if _, dup := rows[cells[0]]; dup {
			t.Errorf("README.md documents %s twice", cells[0])
		}
		rows[cells[0]] = [3]string{cells[1], cells[2], cells[3]}
	}
	return rows
}

func TestREADMEConfigurationTable(t *testing.T) {
	rows := readmeConfigRows(t)
	known := append(envNames(), tracingEnv...)

	t.Run("documents every variable the server reads", func(t *testing.T) {
		for _, name := range known {
			if _, ok := rows[name]; !ok {
				t.Errorf("README.md's configuration table lacks %s", name)
			}
		}
	})

	t.Run("documents no variable the server does not read", func(t *testing.T) {
		for name := range rows {
			if !slices.Contains(known, name) {
				t.Errorf("README.md documents %s, which the server does not read", name)
			}
		}
	})

	t.Run("flags and defaults match the settings table", func(t *testing.T) {
		for _, s := range settings {
			row, ok := rows[s.env]
			if !ok {
				continue // reported above
			}
			if row[0] != "-"+s.flag {
				t.Errorf("%s: README says flag %q, the code -%s", s.env, row[0], s.flag)
			}
			if row[1] != s.def {
				t.Errorf("%s: README says default %q, the code %q", s.env, row[1], s.def)
			}
			if row[2] == "" {
				t.Errorf("%s: README gives no meaning", s.env)
			}
			if file, ok := rows[s.env+"_FILE"]; ok && s.secret {
				if file[0] != "" || file[2] == "" {
					t.Errorf("%s_FILE: README row %q: want no flag and a meaning", s.env, file)
				}
			}
		}
	})
}

// TestComposeReplicas checks docker-compose.replicas.yml: with the base
// service, every instance has its own REPLAYGUARD_MACHINE_ID and host
// port, and is otherwise the base service: same image, environment,
// secrets, healthcheck and dependencies.
func TestComposeReplicas(t *testing.T) {
	base, reps := loadCompose(t), loadComposeFile(t, "docker-compose.replicas.yml")
	first := base.Services["replayguard"]
	baseEnv, err := composeEnvironment(first.Environment)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[uint16]string{}
	hostPorts := map[string]string{}
	instances := map[string]composeService{"replayguard": first}
	maps.Copy(instances, reps.Services)
	if len(instances) < 3 {
		t.Fatalf("%d instances, want the base service and at least two replicas", len(instances))
	}
	for _, name := range slices.Sorted(maps.Keys(instances)) {
		svc := instances[name]
		t.Run(name, func(t *testing.T) {
			env, err := composeEnvironment(svc.Environment)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := composeServerConfig(t, env, svc.Secrets, base.Secrets)
			if err != nil {
				t.Fatalf("its environment does not load: %v", err)
			}
			if cfg.MachineID == nil {
				t.Fatal("no REPLAYGUARD_MACHINE_ID")
			}
			if other, dup := ids[*cfg.MachineID]; dup {
				t.Errorf("machine ID %d is %s's too", *cfg.MachineID, other)
			}
			ids[*cfg.MachineID] = name
			for k := range env {
				if k != "REPLAYGUARD_MACHINE_ID" && composeLiteral(env, k) != composeLiteral(baseEnv, k) {
					t.Errorf("%s = %q, the base service's %q", k, composeLiteral(env, k), composeLiteral(baseEnv, k))
				}
			}
			for k := range baseEnv {
				if _, ok := env[k]; !ok {
					t.Errorf("%s is not set, unlike on the base service", k)
				}
			}
			if svc.Image != first.Image || fmt.Sprint(svc.Build) != fmt.Sprint(first.Build) {
				t.Errorf("image %q build %v, want the base service's %q %v", svc.Image, svc.Build, first.Image, first.Build)
			}
			if fmt.Sprint(svc.Secrets) != fmt.Sprint(first.Secrets) || fmt.Sprint(svc.DependsOn) != fmt.Sprint(first.DependsOn) {
				t.Errorf("secrets %v, depends_on %v: want the base service's", svc.Secrets, svc.DependsOn)
			}
			checkComposeHealthcheck(t, svc)
			for _, p := range svc.Ports {
				s := fmt.Sprint(p)
				if !strings.HasPrefix(s, "127.0.0.1:") {
					t.Errorf("port %q is not on loopback", s)
				}
				host := s[:strings.LastIndex(s, ":")]
				if other, dup := hostPorts[host]; dup {
					t.Errorf("host port %s is %s's too", host, other)
				}
				hostPorts[host] = name
			}
		})
	}
}
