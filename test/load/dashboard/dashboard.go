package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Dashboard is the part of a Grafana dashboard's JSON model that a
// rendering needs.
type Dashboard struct {
	Title      string  `json:"title"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is one panel of a dashboard. Rows carry their own panels while
// collapsed.
type Panel struct {
	Type        string   `json:"type"`
	Title       string   `json:"title"`
	GridPos     GridPos  `json:"gridPos"`
	Targets     []Target `json:"targets"`
	Panels      []Panel  `json:"panels"`
	Collapsed   bool     `json:"collapsed"`
	FieldConfig struct {
		Defaults struct {
			Unit     string   `json:"unit"`
			Decimals *int     `json:"decimals"`
			Min      *float64 `json:"min"`
			Max      *float64 `json:"max"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Options struct {
		Content string `json:"content"`
	} `json:"options"`
}

// GridPos is a panel's place on Grafana's grid: 24 columns wide, rows of
// one unit each.
type GridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

// Target is one query of a panel.
type Target struct {
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
	RefID        string `json:"refId"`
	Hide         bool   `json:"hide"`
}

// Variable is one of the dashboard's template variables.
type Variable struct {
	Name     string          `json:"name"`
	Type     string          `json:"type"`
	AllValue string          `json:"allValue"`
	Current  json.RawMessage `json:"current"`
}

// loadDashboard reads a dashboard's JSON model from path: the model
// itself, or an API export that wraps it as {"dashboard": {...}}.
func loadDashboard(path string) (*Dashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var wrapped struct {
		Dashboard *json.RawMessage `json:"dashboard"`
	}
	if err := json.Unmarshal(b, &wrapped); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if wrapped.Dashboard != nil {
		b = *wrapped.Dashboard
	}
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &d, nil
}

// flatPanels lists the dashboard's panels in grid order, the panels of
// collapsed rows after their row, as Grafana shows them expanded.
func (d *Dashboard) flatPanels() []Panel {
	var out []Panel
	for _, p := range d.Panels {
		out = append(out, p)
		if p.Type == "row" {
			for _, c := range p.Panels {
				out = append(out, c)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].GridPos, out[j].GridPos
		if a.Y != b.Y {
			return a.Y < b.Y
		}
		return a.X < b.X
	})
	return out
}

// Interp holds what Grafana would put in place of its variables.
type Interp struct {
	Step         time.Duration // $__interval
	RateInterval time.Duration // $__rate_interval
	Range        time.Duration // $__range
	Vars         map[string]string
}

// newInterp returns the substitutions for d's variables: a variable's
// current value, or its allValue (else ".*", for a =~ matcher) when that
// is All or absent. Datasource variables are left out: they name the
// data source, which is always the one Prometheus here.
func newInterp(d *Dashboard, step, rateInterval, rng time.Duration) *Interp {
	in := &Interp{Step: step, RateInterval: rateInterval, Range: rng, Vars: map[string]string{}}
	for _, v := range d.Templating.List {
		if v.Name == "" || v.Type == "datasource" {
			continue
		}
		val := currentValue(v.Current)
		if val == "" || val == "$__all" || val == "All" {
			val = v.AllValue
			if val == "" {
				val = ".*"
			}
		}
		in.Vars[v.Name] = val
	}
	return in
}

// currentValue reads a variable's current value: a string, or a list of
// them (joined as a regex alternation).
func currentValue(raw json.RawMessage) string {
	var cur struct {
		Value json.RawMessage `json:"value"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &cur) != nil || len(cur.Value) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(cur.Value, &s) == nil {
		return s
	}
	var list []string
	if json.Unmarshal(cur.Value, &list) == nil {
		for _, v := range list {
			if v == "$__all" {
				return v
			}
		}
		return strings.Join(list, "|")
	}
	return ""
}

// varRef matches the three ways Grafana writes a variable: $name,
// ${name} or ${name:format}, and [[name]].
var varRef = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\[\[([A-Za-z0-9_]+)(?::[^\]]*)?\]\]|\$([A-Za-z0-9_]+)`)

// expand puts values in place of the variables in expr. Unknown
// variables are left as written, so that Prometheus's error names them.
func (in *Interp) expand(expr string) string {
	return varRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := varRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		switch name {
		case "__interval", "__rate_interval", "__range":
			d := map[string]time.Duration{"__interval": in.Step, "__rate_interval": in.RateInterval, "__range": in.Range}[name]
			return promDuration(d)
		case "__interval_ms":
			return strconv.FormatInt(in.Step.Milliseconds(), 10)
		case "__range_s":
			return strconv.FormatInt(int64(in.Range.Seconds()), 10)
		case "__range_ms":
			return strconv.FormatInt(in.Range.Milliseconds(), 10)
		}
		if v, ok := in.Vars[name]; ok {
			return v
		}
		return ref
	})
}

// promDuration writes d as PromQL does: whole seconds ("5s"), else
// milliseconds.
func promDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// legendRef matches {{label}} in a legendFormat.
var legendRef = regexp.MustCompile(`\{\{\s*([A-Za-z0-9_]+)\s*\}\}`)

// legend names a series as Grafana does: legendFormat with each
// {{label}} replaced by the series' value of it; without one (or with
// "__auto"), the series' labels as a selector, else the expression.
func legend(format string, metric map[string]string, expr string) string {
	if format != "" && format != "__auto" {
		return legendRef.ReplaceAllStringFunc(format, func(ref string) string {
			return metric[legendRef.FindStringSubmatch(ref)[1]]
		})
	}
	name := metric["__name__"]
	var keys []string
	for k := range metric {
		if k != "__name__" {
			keys = append(keys, k)
		}
	}
	if name == "" && len(keys) == 0 {
		return expr
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%q", k, metric[k]))
	}
	if len(parts) == 0 {
		return name
	}
	return name + "{" + strings.Join(parts, ", ") + "}"
}
