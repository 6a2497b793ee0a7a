package metrics_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestReadmeListsEveryMetric checks that README's Operations section
// lists every replayguard_* series the server registers, with its labels
// as name{label,...}.
func TestReadmeListsEveryMetric(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	documented := map[string][]string{}
	for _, m := range regexp.MustCompile("`(replayguard_[a-z0-9_]+)(?:\\{([a-z_,]*)\\})?`").FindAllStringSubmatch(readme, -1) {
		var labels []string
		if m[2] != "" {
			labels = strings.Split(m[2], ",")
		}
		if _, seen := documented[m[1]]; !seen || labels != nil {
			documented[m[1]] = labels // a mention with labels wins over a bare one
		}
	}
	for name, f := range registered(t) {
		if !strings.HasPrefix(name, "replayguard_") {
			continue
		}
		labels, ok := documented[name]
		if !ok {
			t.Errorf("README.md does not list %s", name)
			continue
		}
		want := labelNames(f)
		slices.Sort(want)
		got := slices.Sorted(slices.Values(labels))
		if !slices.Equal(got, want) {
			t.Errorf("README.md lists %s with labels %v, want %v", name, labels, want)
		}
	}
}
