package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelMasterName is the name under which StartSentinel's sentinels
// monitor the master.
const SentinelMasterName = "rgmaster"

// sentinelSetupTimeout bounds how long StartSentinel waits for the
// sentinels to agree on the master, see the replica and each other.
const sentinelSetupTimeout = 30 * time.Second

// SentinelSetup is a private Redis Sentinel deployment made by
// StartSentinel: one master, one replica and three sentinels, all on
// loopback ports, all killed by the test's cleanup.
type SentinelSetup struct {
	// MasterName is the name the sentinels monitor the master under
	// (SentinelMasterName), as a FailoverClient's MasterName.
	MasterName string

	t         testing.TB
	master    *RedisProcess
	replica   *RedisProcess
	sentinels []*RedisProcess
}

// StartSentinel starts, with bin (a redis-server, which runs as a sentinel
// with --sentinel), a master, a replica of it (--replicaof) and three
// sentinels that monitor the master with quorum 2, a down-after of 1s and
// a failover timeout of 5s. Each sentinel has its own temp dir and config
// file, which it rewrites as it learns. Where Redis has SENTINEL DEBUG
// (7.0 on), the sentinels' INFO and hello periods are shortened too, so
// that they find each other and the replica in about a second rather
// than ten. It returns once every sentinel reports the master as up,
// knows the replica (link ok) and the two other sentinels, and CKQUORUM
// passes; it fails t if that takes longer than 30s. A failover after the
// master is killed takes a few seconds.
func StartSentinel(t testing.TB, bin string) *SentinelSetup {
	t.Helper()
	s := &SentinelSetup{MasterName: SentinelMasterName, t: t}
	s.master = StartRedis(t, bin)
	s.replica = StartRedis(t, bin, "--replicaof", "127.0.0.1", strconv.Itoa(s.master.Port()))

	ctx, cancel := context.WithTimeout(context.Background(), sentinelSetupTimeout)
	defer cancel()
	if err := waitReplicaLinked(ctx, s.replica.Addr()); err != nil {
		t.Fatalf("replica %s of %s: %v\nreplica log:\n%s", s.replica.Addr(), s.master.Addr(),
			err, tail(s.replica.Output(), 20))
	}
	for i := 0; i < 3; i++ {
		s.sentinels = append(s.sentinels, s.startSentinel(bin))
	}
	if err := s.waitAgreed(ctx); err != nil {
		t.Fatalf("sentinels did not settle within %v: %v\n%s", sentinelSetupTimeout, err, s.Logs())
	}
	return s
}

// startSentinel starts sentinel i. Its config file is written when the
// sentinel first starts on a port; a Restart on the same port keeps the
// file, with what the sentinel wrote into it (the current master, the
// known replicas and sentinels, the epochs).
func (s *SentinelSetup) startSentinel(bin string) *RedisProcess {
	s.t.Helper()
	dir := s.t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	confPort := 0
	args := func(port int) ([]string, error) {
		if port != confPort {
			c := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %q
logfile ""
sentinel monitor %[3]s 127.0.0.1 %[4]d 2
sentinel down-after-milliseconds %[3]s 1000
sentinel failover-timeout %[3]s 5000
sentinel parallel-syncs %[3]s 1
`, port, dir, s.MasterName, s.master.Port())
			if err := os.WriteFile(conf, []byte(c), 0o644); err != nil {
				return nil, err
			}
			confPort = port
		}
		return []string{conf, "--sentinel"}, nil
	}
	return startRedisProcess(s.t, bin, dir, "sentinel.log", args, speedUpSentinel)
}

// speedUpSentinel shortens a sentinel's periods where SENTINEL DEBUG exists
// (Redis 7.0 on): INFO to the master and replicas every second instead of
// every ten, and a hello on the master's channel every 200ms instead of
// every two seconds; and if a stall of the machine puts it in TILT mode,
// where it takes no action, it leaves that after 5s instead of 30s. On an
// older Redis the defaults stay; it only takes longer.
func speedUpSentinel(ctx context.Context, addr string) {
	_, _ = respDo(ctx, addr, "SENTINEL", "DEBUG",
		"info-period", "1000", "publish-period", "200", "tilt-period", "5000")
}

// waitReplicaLinked waits until the replica at addr reports
// master_link_status:up.
func waitReplicaLinked(ctx context.Context, addr string) error {
	var last string
	for {
		v, err := respDo(ctx, addr, "INFO", "replication")
		if err == nil {
			info, _ := v.(string)
			if strings.Contains(info, "master_link_status:up") {
				return nil
			}
			last = "master_link_status is not up"
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not linked to its master: %s", last)
		case <-time.After(50 * time.Millisecond): // polling another process
		}
	}
}

// waitAgreed waits until every sentinel sees the master up, the replica
// with its link ok, the two other sentinels, and reaches quorum.
func (s *SentinelSetup) waitAgreed(ctx context.Context) error {
	var last error
	for {
		last = nil
		for _, sn := range s.sentinels {
			if err := s.checkSentinel(ctx, sn.Addr()); err != nil {
				last = fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
				break
			}
		}
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(50 * time.Millisecond): // polling other processes
		}
	}
}

func (s *SentinelSetup) checkSentinel(ctx context.Context, addr string) error {
	v, err := respDo(ctx, addr, "SENTINEL", "MASTER", s.MasterName)
	if err != nil {
		return err
	}
	m := respMap(v)
	if got := net.JoinHostPort(m["ip"], m["port"]); got != s.master.Addr() {
		return fmt.Errorf("master is %s, want %s", got, s.master.Addr())
	}
	if m["flags"] != "master" {
		return fmt.Errorf("master flags %q", m["flags"])
	}
	v, err = respDo(ctx, addr, "SENTINEL", "REPLICAS", s.MasterName)
	if err != nil {
		return err
	}
	found := false
	for _, r := range respMaps(v) {
		if net.JoinHostPort(r["ip"], r["port"]) == s.replica.Addr() &&
			r["flags"] == "slave" && r["master-link-status"] == "ok" {
			found = true
		}
	}
	if !found {
		return fmt.Errorf("replica %s not known yet (or not linked)", s.replica.Addr())
	}
	v, err = respDo(ctx, addr, "SENTINEL", "SENTINELS", s.MasterName)
	if err != nil {
		return err
	}
	ok := 0
	for _, o := range respMaps(v) {
		if o["flags"] == "sentinel" {
			ok++
		}
	}
	if ok != len(s.sentinels)-1 {
		return fmt.Errorf("knows %d other sentinels, want %d", ok, len(s.sentinels)-1)
	}
	if _, err := respDo(ctx, addr, "SENTINEL", "CKQUORUM", s.MasterName); err != nil {
		return fmt.Errorf("CKQUORUM: %w", err)
	}
	return nil
}

// SentinelAddrs returns the sentinels' addresses (127.0.0.1:PORT), as a
// FailoverClient's SentinelAddrs.
func (s *SentinelSetup) SentinelAddrs() []string {
	out := make([]string, len(s.sentinels))
	for i, sn := range s.sentinels {
		out[i] = sn.Addr()
	}
	return out
}

// Master returns the server started as the master. After a failover it
// is no longer the master (and after Restart without arguments it comes
// back as a master again, which the sentinels then turn into a replica).
func (s *SentinelSetup) Master() *RedisProcess { return s.master }

// Replica returns the server started as a replica of Master. A failover
// promotes it; note that its Restart keeps its --replicaof of the old
// master unless told otherwise.
func (s *SentinelSetup) Replica() *RedisProcess { return s.replica }

// Sentinels returns the three sentinel processes, for tests that stop
// one. A sentinel restarted on its port keeps its rewritten config file.
func (s *SentinelSetup) Sentinels() []*RedisProcess {
	return append([]*RedisProcess(nil), s.sentinels...)
}

// CurrentMaster asks the sentinels, in turn, for the master's address
// (SENTINEL GET-MASTER-ADDR-BY-NAME) and returns the first answer, as
// host:port. During a failover that may be the replica being promoted.
func (s *SentinelSetup) CurrentMaster(ctx context.Context) (string, error) {
	var last error
	for _, sn := range s.sentinels {
		addr, err := s.masterFrom(ctx, sn.Addr())
		if err == nil {
			return addr, nil
		}
		last = fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
	}
	return "", last
}

func (s *SentinelSetup) masterFrom(ctx context.Context, sentinel string) (string, error) {
	v, err := respDo(ctx, sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName)
	if err != nil {
		return "", err
	}
	a, _ := v.([]any)
	if len(a) != 2 {
		return "", fmt.Errorf("GET-MASTER-ADDR-BY-NAME %s: unexpected reply %v", s.MasterName, v)
	}
	host, _ := a[0].(string)
	port, _ := a[1].(string)
	return net.JoinHostPort(host, port), nil
}

// WaitForNewMaster waits until a failover away from old (host:port) has
// finished: every running sentinel reports the same master, which is not
// old, and that server itself says (ROLE) it is a master. It returns the
// new master's address, or an error when ctx ends first; without a
// deadline on ctx it gives up after a minute.
func (s *SentinelSetup) WaitForNewMaster(ctx context.Context, old string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	var last error
	for {
		addr, err := s.agreedMaster(ctx)
		switch {
		case err != nil:
			last = err
		case addr == old:
			last = fmt.Errorf("the sentinels still report %s", old)
		default:
			v, err := respDo(ctx, addr, "ROLE")
			a, _ := v.([]any)
			if err == nil && len(a) > 0 && a[0] == "master" {
				return addr, nil
			}
			if err == nil {
				err = fmt.Errorf("ROLE is %v", v)
			}
			last = fmt.Errorf("sentinels report %s, not a master yet: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no new master instead of %s: %w (%w)", old, last, ctx.Err())
		case <-time.After(50 * time.Millisecond): // polling other processes
		}
	}
}

// agreedMaster returns the master that all running sentinels report, or
// an error when they disagree or none runs.
func (s *SentinelSetup) agreedMaster(ctx context.Context) (string, error) {
	agreed := ""
	for _, sn := range s.sentinels {
		if !sn.Running() {
			continue
		}
		addr, err := s.masterFrom(ctx, sn.Addr())
		if err != nil {
			return "", fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
		}
		if agreed != "" && addr != agreed {
			return "", fmt.Errorf("sentinels disagree: %s and %s", agreed, addr)
		}
		agreed = addr
	}
	if agreed == "" {
		return "", errors.New("no sentinel is running")
	}
	return agreed, nil
}

// Logs returns the end of the log of every process in the setup (master,
// replica, sentinels), for a failing test to print.
func (s *SentinelSetup) Logs() string {
	var b strings.Builder
	fmt.Fprintf(&b, "--- master %s:\n%s\n", s.master.Addr(), tail(s.master.Output(), 15))
	fmt.Fprintf(&b, "--- replica %s:\n%s\n", s.replica.Addr(), tail(s.replica.Output(), 15))
	for _, sn := range s.sentinels {
		fmt.Fprintf(&b, "--- sentinel %s:\n%s\n", sn.Addr(), tail(sn.Output(), 25))
	}
	return b.String()
}
