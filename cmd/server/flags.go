package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// commandLine is what the flags say: the settings given as flags (by
// flag name) and the mode.
type commandLine struct {
	set         map[string]string
	healthcheck bool
}

// usageError is a command line that does not parse: an unknown flag, a
// flag without its value, or an argument that is not a flag. main prints
// it and the usage to stderr and exits 2, as Go's flag package does.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// settingValue holds a setting's flag as given: the setting parses it,
// so that a flag, its variable and its file are read by the same code.
type settingValue struct{ v string }

func (s *settingValue) String() string     { return s.v }
func (s *settingValue) Set(v string) error { s.v = v; return nil }

// healthcheckFlag is the flag of the probe mode (see healthcheck).
const healthcheckFlag = "healthcheck"

// flagSet is the server's flag set: one flag per setting, each a
// *settingValue, and -healthcheck. It prints nothing: see printUsage.
func flagSet() (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet("replayguard", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	hc := fs.Bool(healthcheckFlag, false, "probe GET /healthz of the server at -addr ($REPLAYGUARD_ADDR; an unspecified host such as :8080 means 127.0.0.1) and exit 0 if it answers 200 within "+healthcheckTimeout.String()+", else 1: the container healthcheck of an image without a shell")
	for _, s := range settings {
		fs.Var(&settingValue{}, s.flag, s.usage)
	}
	return fs, hc
}

// parseFlags reads the command line. Its errors are flag.ErrHelp for -h
// and -help, else a *usageError.
func parseFlags(args []string) (*commandLine, error) {
	fs, hc := flagSet()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, &usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{fmt.Errorf("unexpected argument %q: every setting is a -flag", fs.Arg(0))}
	}
	cl := &commandLine{set: map[string]string{}, healthcheck: *hc}
	fs.Visit(func(f *flag.Flag) {
		if v, ok := f.Value.(*settingValue); ok {
			cl.set[f.Name] = v.v
		}
	})
	return cl, nil
}

// flagTypes names the type of each setting's value in the usage, as Go's
// flag package names a typed flag's (-token-ttl duration); unlisted
// settings are strings.
var flagTypes = map[string]string{
	"REPLAYGUARD_SIGNING_KEYS":               "list",
	"REPLAYGUARD_API_KEYS":                   "list",
	"REPLAYGUARD_ADMIN_KEYS":                 "list",
	"REPLAYGUARD_MACHINE_ID":                 "int",
	"REPLAYGUARD_TOKEN_TTL":                  "duration",
	"REPLAYGUARD_TOKEN_MAX_TTL":              "duration",
	"REPLAYGUARD_CLIENT_KEYS":                "file",
	"REPLAYGUARD_REPLAY_WINDOW":              "duration",
	"REPLAYGUARD_IDEMPOTENCY_LOCK_TTL":       "duration",
	"REPLAYGUARD_IDEMPOTENCY_RETENTION":      "duration",
	"REPLAYGUARD_IDEMPOTENCY_MAX_BODY":       "size",
	"REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER": "int",
	"REPLAYGUARD_FINGERPRINT_WINDOW":         "duration",
	"REPLAYGUARD_UPSTREAM":                   "url",
	"REPLAYGUARD_ROUTES":                     "file",
	"REPLAYGUARD_REDIS_URL":                  "url",
	"REPLAYGUARD_REDIS_CLUSTER_ADDRS":        "list",
	"REPLAYGUARD_REDIS_CLUSTER_URL":          "url",
	"REPLAYGUARD_POSTGRES_URL":               "url",
	"REPLAYGUARD_REDIS_SENTINEL_ADDRS":       "list",
	"REPLAYGUARD_REDIS_MIN_REPLICAS":         "int",
	"REPLAYGUARD_STORE_TIMEOUT":              "duration",
	"REPLAYGUARD_MEMORY_MAX_ENTRIES":         "int",
	"REPLAYGUARD_MEMORY_MAX_BYTES":           "size",
	"REPLAYGUARD_ISSUE_RATE":                 "rate",
	"REPLAYGUARD_CORS_ORIGINS":               "list",
	"REPLAYGUARD_TRUSTED_PROXIES":            "list",
	"REPLAYGUARD_LOG_LEVEL":                  "level",
	"REPLAYGUARD_SHUTDOWN_TIMEOUT":           "duration",

	"REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS": "size",
}

// flagType is s's type in the usage.
func flagType(s setting) string {
	if t, ok := flagTypes[s.env]; ok {
		return t
	}
	return "string"
}

const usageHeader = `Usage: replayguard [flags]
       replayguard -healthcheck [-addr address]

Replayguard issues and redeems single-use tokens, verifies signed requests
and keeps Idempotency-Key records; with -upstream it guards an app as a
gateway. Each flag mirrors a REPLAYGUARD_* environment variable: the flag
wins over its variable, which wins over the default. A secret's variable
can also name a file holding it: the variable with _FILE appended.
Types: list is comma-separated; size is bytes with an optional KiB, MiB or
GiB suffix; rate is N/s, N/m or N/h; duration is a Go duration (500ms, 5m).

Flags:
`

// printUsage writes the usage header and every flag to w, each as Go's
// flag.PrintDefaults writes a typed flag: "  -name type", then its usage
// (with its variable) and its default on the next line.
func printUsage(w io.Writer) {
	fs, _ := flagSet()
	var b strings.Builder
	b.WriteString(usageHeader)
	hc := fs.Lookup(healthcheckFlag)
	fmt.Fprintf(&b, "  -%s\n    \t%s\n", hc.Name, hc.Usage)
	for _, s := range settings {
		typ := flagType(s)
		fmt.Fprintf(&b, "  -%s %s\n    \t%s ($%s", s.flag, typ, s.usage, s.env)
		if s.secret {
			fmt.Fprintf(&b, " or the file $%s_FILE", s.env)
		}
		b.WriteString(")")
		switch {
		case s.def == "":
		case typ == "string":
			fmt.Fprintf(&b, " (default %q)", s.def)
		default:
			fmt.Fprintf(&b, " (default %s)", s.def)
		}
		b.WriteString("\n")
	}
	_, _ = io.WriteString(w, b.String())
}
