package main

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
	"time"
)

// Grafana's grid: 24 columns; each height unit is 30px plus an 8px
// margin between panels.
const (
	gridColumns = 24
	unitHeight  = 30
	gridMargin  = 8
	pagePad     = 12
	headerH     = 44
)

// Grafana's classic palette, for the series of a panel in order.
var palette = []string{"#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0", "#508642", "#CCA300", "#447EBC", "#C15C17"}

// Rendered is a panel with the answers to its queries.
type Rendered struct {
	Panel  Panel
	Series []Named
	Errors []string
}

// Named is a series with its legend.
type Named struct {
	Name string
	Series
}

// Box is a panel's place on the page, in pixels.
type Box struct{ X, Y, W, H int }

// layout places a grid position on a page width pixels wide, as Grafana
// does: columns of (width-2*pad)/24 and rows of 30px, 8px apart.
func layout(g GridPos, width int) Box {
	col := float64(width-2*pagePad+gridMargin) / gridColumns
	w, h := g.W, g.H
	if w <= 0 {
		w = 12
	}
	if h <= 0 {
		h = 8
	}
	return Box{
		X: pagePad + int(math.Round(float64(g.X)*col)),
		Y: pagePad + headerH + g.Y*(unitHeight+gridMargin),
		W: int(math.Round(float64(w)*col)) - gridMargin,
		H: h*(unitHeight+gridMargin) - gridMargin,
	}
}

// page writes the whole HTML page of the rendered panels, width pixels
// wide, and returns it with its height.
func page(title string, start, end time.Time, panels []Rendered, width int) (string, int) {
	height := pagePad + headerH
	var b strings.Builder
	for _, r := range panels {
		box := layout(r.Panel.GridPos, width)
		if r.Panel.Type == "row" {
			box.H = unitHeight
		}
		if bottom := box.Y + box.H + pagePad; bottom > height {
			height = bottom
		}
		b.WriteString(panelHTML(r, box, start, end))
	}
	var p strings.Builder
	fmt.Fprintf(&p, `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>%s</title>
<style>
body{margin:0;background:#111217;color:#ccccdc;font:12px Inter,Helvetica,Arial,sans-serif}
#page{position:relative;width:%dpx;height:%dpx}
h1{position:absolute;left:%dpx;top:8px;margin:0;font-size:18px;font-weight:500}
.range{position:absolute;right:%dpx;top:12px;color:#8e8e9e}
.panel{position:absolute;box-sizing:border-box;background:#181b1f;border:1px solid #2c3235;border-radius:2px;overflow:hidden}
.panel h2{margin:0;padding:6px 8px;font-size:13px;font-weight:500;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.row{position:absolute;font-size:14px;font-weight:500;border-bottom:1px solid #2c3235}
.err{color:#f2495c;padding:4px 8px}
.nodata{position:absolute;top:45%%;width:100%%;text-align:center;color:#8e8e9e}
.legend{padding:0 8px;line-height:16px;white-space:nowrap;overflow:hidden}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:14px;height:4px;margin-right:5px;vertical-align:middle;border-radius:2px}
.stat{text-align:center;font-size:34px;font-weight:500}
.text{padding:4px 8px;white-space:pre-wrap}
svg text{fill:#8e8e9e;font-size:10px}
</style></head>
<body><div id="page">
<h1>%s</h1><div class="range">%s to %s UTC</div>
%s</div></body></html>
`, html.EscapeString(title), width, height, pagePad, pagePad, html.EscapeString(title),
		start.UTC().Format("2006-01-02 15:04:05"), end.UTC().Format("15:04:05"), b.String())
	return p.String(), height
}

// panelHTML writes one panel in its box.
func panelHTML(r Rendered, box Box, start, end time.Time) string {
	p := r.Panel
	if p.Type == "row" {
		return fmt.Sprintf(`<div class="row" style="left:%dpx;top:%dpx;width:%dpx;height:%dpx;line-height:%dpx">%s</div>
`, box.X, box.Y, box.W, unitHeight, unitHeight, html.EscapeString(p.Title))
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<div class="panel" style="left:%dpx;top:%dpx;width:%dpx;height:%dpx"><h2>%s</h2>`,
		box.X, box.Y, box.W, box.H, html.EscapeString(p.Title))
	for _, e := range r.Errors {
		fmt.Fprintf(&b, `<div class="err">%s</div>`, html.EscapeString(e))
	}
	inner := Box{W: box.W - 2, H: box.H - 2 - 28 - 16*len(r.Errors)}
	switch p.Type {
	case "text":
		fmt.Fprintf(&b, `<div class="text">%s</div>`, html.EscapeString(p.Options.Content))
	case "stat", "gauge", "singlestat", "bargauge":
		b.WriteString(statHTML(r))
	default:
		if len(r.Series) == 0 && len(r.Errors) == 0 {
			b.WriteString(`<div class="nodata">No data</div>`)
			break
		}
		rows := legendRows(r.Series, inner.W)
		chartH := inner.H - 16*rows - 4
		b.WriteString(chartSVG(r.Series, p, inner.W, chartH, start, end))
		b.WriteString(legendHTML(r.Series, rows, inner.W))
	}
	b.WriteString("</div>\n")
	return b.String()
}

// statHTML writes each series' last value, large.
func statHTML(r Rendered) string {
	var b strings.Builder
	for i, s := range r.Series {
		if i == 4 {
			break
		}
		v := math.NaN()
		for j := len(s.Values) - 1; j >= 0; j-- {
			if !math.IsNaN(s.Values[j]) {
				v = s.Values[j]
				break
			}
		}
		label := ""
		if len(r.Series) > 1 {
			label = `<div style="font-size:11px;color:#8e8e9e">` + html.EscapeString(s.Name) + `</div>`
		}
		fmt.Fprintf(&b, `<div class="stat" style="color:%s">%s%s</div>`, palette[i%len(palette)], label,
			html.EscapeString(formatValue(v, r.Panel.FieldConfig.Defaults.Unit, 0)))
	}
	if len(r.Series) == 0 && len(r.Errors) == 0 {
		b.WriteString(`<div class="nodata">No data</div>`)
	}
	return b.String()
}

// legendWidth estimates the pixels one legend entry takes.
func legendWidth(name string) int { return 19 + 6*len([]rune(name)) + 14 }

// legendRows counts the lines the legend takes at width pixels, at most 4.
func legendRows(series []Named, width int) int {
	rows, x := 1, 8
	for _, s := range series {
		w := legendWidth(s.Name)
		if x+w > width-8 && x > 8 {
			rows++
			x = 8
		}
		x += w
	}
	if rows > 4 {
		rows = 4
	}
	return rows
}

func legendHTML(series []Named, rows, width int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `<div class="legend" style="height:%dpx;white-space:normal">`, 16*rows)
	for i, s := range series {
		fmt.Fprintf(&b, `<span><i style="background:%s"></i>%s</span>`, palette[i%len(palette)], html.EscapeString(s.Name))
	}
	b.WriteString("</div>")
	return b.String()
}

// chartSVG draws series as lines over [start, end] in a w×h SVG with a
// y axis of a few round ticks in the panel's unit and time ticks below.
// A gap of more than two steps, or a NaN, breaks a line.
func chartSVG(series []Named, p Panel, w, h int, start, end time.Time) string {
	const left, right, top, bottom = 60, 10, 6, 20
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	if pw < 10 || ph < 10 {
		return ""
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, v := range s.Values {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	if lo > 0 {
		lo = 0
	}
	d := p.FieldConfig.Defaults
	if d.Min != nil {
		lo = *d.Min
	}
	if d.Max != nil {
		hi = *d.Max
	}
	if hi <= lo {
		hi = lo + 1
	}
	ticks := niceTicks(lo, hi, int(ph/40)+1)
	lo = math.Min(lo, ticks[0])
	hi = math.Max(hi, ticks[len(ticks)-1])
	span := end.Sub(start).Seconds()
	if span <= 0 {
		span = 1
	}
	xOf := func(t time.Time) float64 { return left + pw*t.Sub(start).Seconds()/span }
	yOf := func(v float64) float64 { return top + ph*(1-(v-lo)/(hi-lo)) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg width="%d" height="%d" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg">`, w, h, w, h)
	for _, t := range ticks {
		y := yOf(t)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#2c3235"/>`, left, w-right, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, left-6, y+3,
			html.EscapeString(formatValue(t, d.Unit, tickDecimals(ticks))))
	}
	for _, t := range timeTicks(start, end, int(pw/90)+1) {
		x := xOf(t)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%.1f" stroke="#2c3235"/>`, x, x, top, top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, h-6, t.UTC().Format("15:04:05"))
	}
	for i, s := range series {
		var path strings.Builder
		pen := false
		var prev time.Time
		gap := 2 * medianStep(s.Times)
		for j, v := range s.Values {
			t := s.Times[j]
			if math.IsNaN(v) || math.IsInf(v, 0) {
				pen = false
				continue
			}
			if pen && gap > 0 && t.Sub(prev) > gap {
				pen = false
			}
			cmd := "L"
			if !pen {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f %.1f ", cmd, xOf(t), yOf(v))
			pen, prev = true, t
		}
		if path.Len() == 0 {
			continue
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-linejoin="round"/>`,
			strings.TrimSpace(path.String()), palette[i%len(palette)])
	}
	b.WriteString("</svg>")
	return b.String()
}

// medianStep is the usual distance between a series' samples.
func medianStep(ts []time.Time) time.Duration {
	if len(ts) < 2 {
		return 0
	}
	var min time.Duration
	for i := 1; i < len(ts); i++ {
		if d := ts[i].Sub(ts[i-1]); min == 0 || d < min {
			min = d
		}
	}
	return min
}

// niceTicks returns round ticks (1, 2 or 5 times a power of ten apart)
// covering [lo, hi], about n of them.
func niceTicks(lo, hi float64, n int) []float64 {
	if n < 2 {
		n = 2
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		step = m * mag
		if step >= raw {
			break
		}
	}
	first := math.Floor(lo/step) * step
	var out []float64
	for v := first; v < hi+step*0.999; v += step {
		out = append(out, math.Round(v/step)*step)
	}
	return out
}

// tickDecimals is the number of decimals that tells ticks apart.
func tickDecimals(ticks []float64) int {
	if len(ticks) < 2 {
		return 0
	}
	step := math.Abs(ticks[1] - ticks[0])
	for dec := 0; dec < 6; dec++ {
		if math.Abs(step*math.Pow(10, float64(dec))-math.Round(step*math.Pow(10, float64(dec)))) < 1e-9 {
			return dec
		}
	}
	return 6
}

// timeTicks returns about n round times in [start, end].
func timeTicks(start, end time.Time, n int) []time.Time {
	if n < 2 {
		n = 2
	}
	span := end.Sub(start)
	step := time.Hour
	for _, s := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour} {
		if span/s <= time.Duration(n) {
			step = s
			break
		}
	}
	var out []time.Time
	for t := start.Truncate(step); !t.After(end); t = t.Add(step) {
		if !t.Before(start) {
			out = append(out, t)
		}
	}
	return out
}

// formatValue writes v in a Grafana unit: the time units (s, ms, µs),
// rates (reqps, ops, cps), percent and percentunit, bytes, and short or
// none (SI suffixes); any other unit is appended as written.
func formatValue(v float64, unit string, decimals int) string {
	if math.IsNaN(v) {
		return "NaN"
	}
	switch unit {
	case "s", "ms", "µs", "us", "ns":
		sec := v * map[string]float64{"s": 1, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}[unit]
		a := math.Abs(sec)
		switch {
		case a == 0:
			return "0"
		case a < 1e-3:
			return trim(sec*1e6) + " µs"
		case a < 1:
			return trim(sec*1e3) + " ms"
		default:
			return trim(sec) + " s"
		}
	case "percent":
		return trim(v) + "%"
	case "percentunit":
		return trim(v*100) + "%"
	case "bytes", "decbytes":
		base, names := 1024.0, []string{"B", "KiB", "MiB", "GiB", "TiB"}
		if unit == "decbytes" {
			base, names = 1000, []string{"B", "kB", "MB", "GB", "TB"}
		}
		i := 0
		for math.Abs(v) >= base && i < len(names)-1 {
			v /= base
			i++
		}
		return trim(v) + " " + names[i]
	}
	s := si(v, decimals)
	switch unit {
	case "", "short", "none":
		return s
	case "reqps":
		return s + " req/s"
	case "ops":
		return s + " ops/s"
	case "cps":
		return s + " c/s"
	case "rps":
		return s + " rd/s"
	case "wps":
		return s + " wr/s"
	}
	return s + " " + unit
}

// si writes v with a k, M or G suffix past a thousand.
func si(v float64, decimals int) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return trim(v/1e9) + "G"
	case a >= 1e6:
		return trim(v/1e6) + "M"
	case a >= 1e3:
		return trim(v/1e3) + "k"
	}
	if decimals > 0 {
		return strconv.FormatFloat(v, 'f', decimals, 64)
	}
	return trim(v)
}

// trim writes v with up to three significant decimals and no trailing
// zeros.
func trim(v float64) string {
	dec := 0
	switch a := math.Abs(v); {
	case a == 0:
	case a < 1:
		dec = 3
	case a < 10:
		dec = 2
	case a < 100:
		dec = 1
	}
	s := strconv.FormatFloat(v, 'f', dec, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
