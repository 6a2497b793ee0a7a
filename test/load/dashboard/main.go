// Command dashboard renders a Grafana dashboard's panels from a
// Prometheus server as one self-contained HTML page, for a screenshot
// where Grafana itself is not at hand (test/load/dashboard.sh).
//
// It reads the dashboard's JSON model (-dashboard), asks Prometheus
// (-prometheus, loopback only) for each panel's targets over [-start,
// -end] through GET /api/v1/query_range, and lays the panels out in the
// dashboard's gridPos grid (24 columns, 30px rows) with inline SVG line
// charts: title, y ticks in the panel's fieldConfig.defaults.unit, time
// ticks in UTC, a legend from each target's legendFormat ({{label}}
// replaced). Stat panels show each series' last value; text panels their
// content; rows their title.
//
// Grafana's variables become: $__interval the step, $__rate_interval
// -rate-interval, $__range the range; a template variable its current
// value, or its allValue (else .*) when that is All. Datasource
// variables and panels' datasource are ignored: every query goes to
// -prometheus.
//
// It prints the page's size in pixels, "WIDTH HEIGHT", for the
// screenshot's window. Queries that fail are shown in their panel and
// listed on stderr, and so are panels without data; the exit status is 1
// when any query failed, 2 on bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	dashboard    string
	prometheus   string
	out          string
	start, end   time.Time
	step         time.Duration
	rateInterval time.Duration
	width        int
	title        string
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	c := &config{}
	var start, end string
	fs := flag.NewFlagSet("dashboard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.dashboard, "dashboard", "docs/grafana/replayguard.json", "path of the Grafana dashboard JSON")
	fs.StringVar(&c.prometheus, "prometheus", "http://127.0.0.1:9090", "base URL of Prometheus (loopback only)")
	fs.StringVar(&c.out, "out", "dashboard.html", "path of the HTML page to write")
	fs.StringVar(&start, "start", "", "start of the range: Unix seconds or RFC 3339 (default: -end less 5m)")
	fs.StringVar(&end, "end", "", "end of the range: Unix seconds or RFC 3339 (default: now)")
	fs.DurationVar(&c.step, "step", 2*time.Second, "query resolution, and $__interval")
	fs.DurationVar(&c.rateInterval, "rate-interval", 5*time.Second, "$__rate_interval (Grafana's is four scrape intervals)")
	fs.IntVar(&c.width, "width", 1600, "page width in pixels")
	fs.StringVar(&c.title, "title", "", "page title (default: the dashboard's)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	c.end = time.Now()
	if end != "" {
		if c.end, err = parseTime(end); err != nil {
			return nil, fmt.Errorf("-end: %w", err)
		}
	}
	c.start = c.end.Add(-5 * time.Minute)
	if start != "" {
		if c.start, err = parseTime(start); err != nil {
			return nil, fmt.Errorf("-start: %w", err)
		}
	}
	if !c.start.Before(c.end) {
		return nil, errors.New("-start must come before -end")
	}
	if c.step <= 0 || c.rateInterval <= 0 {
		return nil, errors.New("-step and -rate-interval must be positive")
	}
	if c.width < 400 {
		return nil, errors.New("-width must be at least 400")
	}
	if err := checkLoopback(c.prometheus); err != nil {
		return nil, err
	}
	c.prometheus = strings.TrimRight(c.prometheus, "/")
	return c, nil
}

// parseTime reads Unix seconds (with a fraction) or RFC 3339.
func parseTime(s string) (time.Time, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Unix(0, int64(f*1e9)).UTC(), nil
	}
	return time.Parse(time.RFC3339, s)
}

// checkLoopback accepts http URLs of localhost or a loopback IP.
func checkLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("-prometheus %q: want http://host:port", raw)
	}
	if h := u.Hostname(); h == "localhost" {
		return nil
	} else if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("-prometheus %q: only loopback addresses are allowed", raw)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "dashboard:", err)
		}
		return 2
	}
	d, err := loadDashboard(c.dashboard)
	if err != nil {
		fmt.Fprintln(stderr, "dashboard:", err)
		return 1
	}
	html, height, failed := render(ctx, c, d, stderr)
	if err := os.WriteFile(c.out, []byte(html), 0o644); err != nil {
		fmt.Fprintln(stderr, "dashboard:", err)
		return 1
	}
	fmt.Fprintf(stdout, "%d %d\n", c.width, height)
	if failed > 0 {
		return 1
	}
	return 0
}

// render queries every panel's targets and writes the page; it returns
// the page, its height and the number of queries that failed, each
// reported on stderr.
func render(ctx context.Context, c *config, d *Dashboard, stderr io.Writer) (string, int, int) {
	client := &http.Client{Timeout: 30 * time.Second}
	in := newInterp(d, c.step, c.rateInterval, c.end.Sub(c.start))
	failed := 0
	var panels []Rendered
	for _, p := range d.flatPanels() {
		r := Rendered{Panel: p}
		for _, t := range p.Targets {
			if t.Hide || strings.TrimSpace(t.Expr) == "" {
				continue
			}
			expr := in.expand(t.Expr)
			series, err := queryRange(ctx, client, c.prometheus, expr, c.start, c.end, c.step)
			if err != nil {
				failed++
				msg := fmt.Sprintf("%s: %v", t.RefID, err)
				r.Errors = append(r.Errors, msg)
				fmt.Fprintf(stderr, "dashboard: panel %q: %s (query %s)\n", p.Title, msg, expr)
				continue
			}
			for _, s := range series {
				r.Series = append(r.Series, Named{Name: legend(t.LegendFormat, s.Metric, expr), Series: s})
			}
		}
		if len(p.Targets) > 0 && len(r.Series) == 0 && len(r.Errors) == 0 {
			fmt.Fprintf(stderr, "dashboard: panel %q: no data\n", p.Title)
		}
		panels = append(panels, r)
	}
	title := c.title
	if title == "" {
		title = d.Title
	}
	html, height := page(title, c.start, c.end, panels, c.width)
	return html, height, failed
}
