package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Series is one time series of a range query's answer.
type Series struct {
	Metric map[string]string
	Times  []time.Time
	Values []float64 // NaN where Prometheus answered NaN
}

// queryRange asks Prometheus at base for expr over [start, end] at step,
// through its HTTP API (GET /api/v1/query_range).
func queryRange(ctx context.Context, client *http.Client, base, expr string, start, end time.Time, step time.Duration) ([]Series, error) {
	q := url.Values{}
	q.Set("query", expr)
	q.Set("start", strconv.FormatInt(start.Unix(), 10))
	q.Set("end", strconv.FormatInt(end.Unix(), 10))
	q.Set("step", strconv.FormatFloat(step.Seconds(), 'f', -1, 64))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query_range?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	var ans struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		return nil, fmt.Errorf("query_range answered %s: %.200s", resp.Status, body)
	}
	if ans.Status != "success" {
		return nil, fmt.Errorf("query_range: %s", ans.Error)
	}
	if ans.Data.ResultType != "matrix" {
		return nil, fmt.Errorf("query_range answered a %s, not a matrix", ans.Data.ResultType)
	}
	out := make([]Series, 0, len(ans.Data.Result))
	for _, r := range ans.Data.Result {
		s := Series{Metric: r.Metric}
		for _, p := range r.Values {
			ts, ok1 := p[0].(float64)
			vs, ok2 := p[1].(string)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("query_range: malformed sample %v", p)
			}
			v, err := strconv.ParseFloat(vs, 64)
			if err != nil {
				v = math.NaN()
			}
			s.Times = append(s.Times, time.Unix(0, int64(ts*1e9)).UTC())
			s.Values = append(s.Values, v)
		}
		out = append(out, s)
	}
	return out, nil
}
