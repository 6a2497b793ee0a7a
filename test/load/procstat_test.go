package main

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

func TestParseWatch(t *testing.T) {
	got, err := parseWatch("server:12, postgres:34+")
	if err != nil {
		t.Fatal(err)
	}
	want := []watched{{"server", 12, false}, {"postgres", 34, true}}
	if !slices.Equal(got, want) {
		t.Fatalf("parseWatch = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"server", "server:", "server:+", "server:12++", "load:12", ":12"} {
		if _, err := parseWatch(bad); err == nil {
			t.Errorf("parseWatch(%q) accepted it", bad)
		}
	}
}

// TestTreeTicks counts a process with its descendants: a child of this
// test is one of them, and the tree's ticks are at least the process's
// own.
func TestTreeTicks(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() {
		_ = child.Process.Kill()
		_ = child.Wait()
	})
	self := os.Getpid()
	if ds := descendants(allStats(), self); ds[0] != self || !slices.Contains(ds, child.Process.Pid) {
		t.Fatalf("descendants of %d = %v, want it and its child %d", self, ds, child.Process.Pid)
	}
	own, ok1 := procTicks("/proc/self/stat")
	tree, ok2 := treeTicks(self)
	if !ok1 || !ok2 || tree < own {
		t.Fatalf("treeTicks = %d (%v), own ticks = %d (%v): want at least its own", tree, ok2, own, ok1)
	}
	if _, ok := treeTicks(1 << 30); ok {
		t.Error("treeTicks of a pid that does not exist reported ticks")
	}
	s := sampleCPU([]watched{{"postgres", self, true}})
	if _, ok := s["postgres"]; !ok {
		t.Errorf("sampleCPU of a tree = %v, want a postgres entry", s)
	}
}

func TestSampleCPUSumsARepeatedName(t *testing.T) {
	self := os.Getpid()
	own, ok := procTicks("/proc/self/stat")
	if !ok {
		t.Skip("no /proc/self/stat")
	}
	// The same process twice under one name, as run.sh watches the three
	// nodes of a Redis Cluster as redis: counted twice.
	s := sampleCPU([]watched{{"redis", self, false}, {"redis", self, false}})
	if s["redis"] < 2*own {
		t.Errorf("sampleCPU of a name given twice = %d ticks, want at least twice its process's %d", s["redis"], own)
	}
	ws, err := parseWatch("server:1,redis:2,redis:3,redis:4")
	if err != nil || len(ws) != 4 {
		t.Errorf("parseWatch with a repeated name = %v, %v; want four entries", ws, err)
	}
}
