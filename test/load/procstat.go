package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc CPU times: 100 on every Linux
// ABI Go supports.
const clockTicks = 100

// watched is one process whose CPU time a run reports, with its
// descendants when tree is set.
type watched struct {
	name string
	pid  int
	tree bool
}

// parseWatch reads "name:pid,name:pid+": a pid with a + counts the
// process and every descendant, for a server such as PostgreSQL that
// works in child processes (its backends). A name given more than once
// counts the sum of its processes, such as the nodes of a Redis Cluster
// (redis:pid1,redis:pid2,redis:pid3).
func parseWatch(spec string) ([]watched, error) {
	var out []watched
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, pid, ok := strings.Cut(part, ":")
		pid, tree := strings.CutSuffix(pid, "+")
		n, err := strconv.Atoi(pid)
		if !ok || name == "" || err != nil || n < 1 || reservedCPUName[name] {
			return nil, fmt.Errorf("-watch %q: want name:pid,... or name:pid+ for a process and its descendants (names other than load, machine, irq, steal, other)", part)
		}
		out = append(out, watched{name, n, tree})
	}
	return out, nil
}

var reservedCPUName = map[string]bool{"load": true, "machine": true, "irq": true, "steal": true, "other": true}

// cpuSample is CPU ticks used so far, per name.
type cpuSample map[string]int64

// sampleCPU reads the CPU ticks of this process ("load"), each watched
// process and the whole machine ("machine": all CPUs running processes;
// "irq": interrupts; "steal": taken by the hypervisor). Whatever cannot be
// read is left out.
func sampleCPU(ws []watched) cpuSample {
	s := cpuSample{}
	if t, ok := procTicks("/proc/self/stat"); ok {
		s["load"] = t
	}
	for _, w := range ws {
		if w.tree {
			if t, ok := treeTicks(w.pid); ok {
				s[w.name] += t
			}
		} else if t, ok := procTicks("/proc/" + strconv.Itoa(w.pid) + "/stat"); ok {
			s[w.name] += t
		}
	}
	if busy, irq, steal, ok := machineTicks(); ok {
		s["machine"], s["irq"], s["steal"] = busy, irq, steal
	}
	return s
}

// since returns the CPU seconds used between before and s, with "other"
// as the machine's process time less every named process: what processes
// outside the run took.
func (s cpuSample) since(before cpuSample) map[string]float64 {
	out := map[string]float64{}
	var named int64
	for k, v := range s {
		b, ok := before[k]
		if !ok {
			continue
		}
		out[k] = float64(v-b) / clockTicks
		if k != "machine" && k != "irq" && k != "steal" {
			named += v - b
		}
	}
	if m, ok := out["machine"]; ok {
		out["other"] = max(m-float64(named)/clockTicks, 0)
	}
	if len(out) == 0 {
		return nil
	}
	return roundMap(out)
}

// procTicks returns utime+stime of a /proc/PID/stat file.
func procTicks(path string) (int64, bool) {
	st, ok := readStat(path)
	return st.utime + st.stime, ok
}

// procStat is what a /proc/PID/stat file says of a process's CPU time:
// its own (utime, stime) and that of its children it has waited for
// (cutime, cstime), in clock ticks.
type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(path string) (procStat, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, false
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), f[1] field 4 (ppid); utime, stime, cutime
	// and cstime are fields 14 to 17.
	if len(f) < 15 {
		return procStat{}, false
	}
	var v [5]int64
	for j, k := range []int{1, 11, 12, 13, 14} {
		if v[j], err = strconv.ParseInt(f[k], 10, 64); err != nil {
			return procStat{}, false
		}
	}
	return procStat{ppid: int(v[0]), utime: v[1], stime: v[2], cutime: v[3], cstime: v[4]}, true
}

// treeTicks returns the CPU ticks of pid and its descendants: each one's
// own and its waited-for children's, so that a child that exits between
// two samples stays counted (in its parent's cutime, once reaped).
func treeTicks(pid int) (int64, bool) {
	stats := allStats()
	if _, ok := stats[pid]; !ok {
		return 0, false
	}
	var total int64
	for _, p := range descendants(stats, pid) {
		st := stats[p]
		total += st.utime + st.stime + st.cutime + st.cstime
	}
	return total, true
}

// allStats reads /proc/PID/stat of every process.
func allStats() map[int]procStat {
	out := map[int]procStat{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat("/proc/" + e.Name() + "/stat"); ok {
			out[pid] = st
		}
	}
	return out
}

// descendants returns pid and, from stats, every process below it.
func descendants(stats map[int]procStat, pid int) []int {
	children := map[int][]int{}
	for p, st := range stats {
		children[st.ppid] = append(children[st.ppid], p)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// machineTicks returns, from the first line of /proc/stat, the ticks all
// CPUs spent running processes (user, nice and system: what the
// processes' own utime and stime add up to), in interrupts (irq and
// softirq, where the kernel does much of loopback TCP), and stolen by the
// hypervisor.
func machineTicks() (busy, irq, steal int64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, 0, false
	}
	var v [8]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return 0, 0, 0, false
		}
	}
	// user nice system idle iowait irq softirq steal
	return v[0] + v[1] + v[2], v[5] + v[6], v[7], true
}
