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

// watched is one process whose CPU time a run reports.
type watched struct {
	name string
	pid  int
}

// parseWatch reads "name:pid,name:pid".
func parseWatch(spec string) ([]watched, error) {
	var out []watched
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, pid, ok := strings.Cut(part, ":")
		n, err := strconv.Atoi(pid)
		if !ok || name == "" || err != nil || n < 1 || reservedCPUName[name] {
			return nil, fmt.Errorf("-watch %q: want name:pid,... (names other than load, machine, irq, steal, other)", part)
		}
		out = append(out, watched{name, n})
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
		if t, ok := procTicks("/proc/" + strconv.Itoa(w.pid) + "/stat"); ok {
			s[w.name] = t
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
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return u + st, true
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
