package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// Shape of the concurrent redemption runs: every token is redeemed by
// attemptsPerToken goroutines released at once, and tokensAtOnce tokens
// are raced at a time, so up to tokensAtOnce*attemptsPerToken requests
// are in flight.
const (
	raceTokens        = 200 // per store
	twoInstanceTokens = 100 // shared between two instances
	attemptsPerToken  = 20
	tokensAtOnce      = 10
	inFlight          = tokensAtOnce * attemptsPerToken
)

// backend opens a store for one test; shared stores get a fresh prefix.
type backend struct {
	name string
	open func(t *testing.T, prefix string) store.Store
}

// backends are the stores the concurrency tests run on. Redis, Redis
// Cluster and PostgreSQL skip (or fail under REPLAYGUARD_TEST_REQUIRE=1 or
// CI=true) when their variable is unset.
var backends = []backend{
	{"memory", func(*testing.T, string) store.Store { return memory.New() }},
	sharedBackends[0],
	sharedBackends[1],
	{"postgres", func(t *testing.T, _ string) store.Store { return openPostgres(t) }},
}

// sharedBackends are the stores several instances can share.
var sharedBackends = []backend{
	{"redis", func(t *testing.T, prefix string) store.Store {
		return openRedis(t, requireEnv(t, envRedisURL), prefix)
	}},
	{"redis cluster", func(t *testing.T, prefix string) store.Store {
		return openCluster(t, requireEnv(t, envClusterAddrs), prefix)
	}},
}

// outcome is what one redemption attempt got.
type outcome struct {
	status int
	code   string // problem code, or the redeemed ID on 200
	err    error
}

func (o outcome) String() string {
	switch {
	case o.err != nil:
		return "error: " + o.err.Error()
	case o.status == http.StatusOK:
		return "200"
	}
	return strconv.Itoa(o.status) + " " + o.code
}

// raceRedemptions issues n tokens, token i on servers[i%len(servers)], then
// has attemptsPerToken goroutines redeem each one at once, attempt j on
// servers[j%len(servers)]. It requires exactly one 200 per token, carrying
// that token's ID, and token_used for every other attempt.
func raceRedemptions(t *testing.T, n int, servers ...*server) {
	t.Helper()
	toks := make([]issued, n)
	for i := range toks {
		toks[i] = servers[i%len(servers)].issue(t, `{"purpose":"race"}`)
	}

	results := make([][attemptsPerToken]outcome, n)
	slots := make(chan struct{}, tokensAtOnce)
	var all sync.WaitGroup
	for i, tok := range toks {
		slots <- struct{}{}
		all.Go(func() {
			defer func() { <-slots }()
			start := make(chan struct{})
			var attempts sync.WaitGroup
			for j := range attemptsPerToken {
				s := servers[j%len(servers)]
				req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/tokens/redeem", strings.NewReader(`{"purpose":"race"}`))
				if err != nil {
					results[i][j] = outcome{err: err}
					continue
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(token.Header, tok.Token)
				attempts.Go(func() {
					<-start
					r, err := send(s.Client, req)
					switch {
					case err != nil:
						results[i][j] = outcome{err: err}
					case r.Status == http.StatusOK:
						var got redeemed
						if jerr := json.Unmarshal(r.Body, &got); jerr != nil {
							results[i][j] = outcome{status: r.Status, err: jerr}
						} else {
							results[i][j] = outcome{status: r.Status, code: got.ID}
						}
					default:
						results[i][j] = outcome{status: r.Status, code: problemCode(r.Body)}
					}
				})
			}
			close(start)
			attempts.Wait()
		})
	}
	all.Wait()

	counts := map[string]int{}
	for i, rs := range results {
		wins := 0
		for _, o := range rs {
			counts[o.String()]++
			if o.err == nil && o.status == http.StatusOK {
				wins++
				if o.code != toks[i].ID {
					t.Errorf("token %d: 200 for id %q, want %q", i, o.code, toks[i].ID)
				}
			}
		}
		if wins != 1 {
			t.Errorf("token %d (id %s) was redeemed %d times, want exactly once", i, toks[i].ID, wins)
		}
	}
	want := map[string]int{
		"200":            n,
		"409 token_used": n * (attemptsPerToken - 1),
	}
	if !equalCounts(counts, want) {
		t.Errorf("outcomes of %d redemptions:\n%s\nwant:\n%s", n*attemptsPerToken, formatCounts(counts), formatCounts(want))
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %6d × %s\n", m[k], k)
	}
	return b.String()
}

// TestConcurrentRedemption races attemptsPerToken redemptions of each of
// raceTokens tokens over real HTTP, on every store: exactly one wins.
func TestConcurrentRedemption(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s := startServer(t, b.open(t, uniquePrefix(t)), serverConfig{conns: inFlight}) // no issue rate: no limiter
			raceRedemptions(t, raceTokens, s)
		})
	}
}

// TestTwoInstances runs two instances, as two processes would be: each
// its own token.Service, engine, listener and Redis client, sharing one
// Redis (under one prefix) and one key ring, with different machine IDs.
func TestTwoInstances(t *testing.T) {
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			prefix, keys := uniquePrefix(t), newKeys(t, "shared")
			a := startServer(t, b.open(t, prefix), serverConfig{keys: keys, machineID: 101, conns: inFlight})
			bb := startServer(t, b.open(t, prefix), serverConfig{keys: keys, machineID: 102, conns: inFlight})

			t.Run("each instance stamps its own machine ID", func(t *testing.T) {
				for _, c := range []struct {
					s    *server
					want uint64
				}{{a, 101}, {bb, 102}} {
					tok := c.s.issue(t, "")
					id, err := strconv.ParseUint(tok.ID, 10, 64)
					if err != nil {
						t.Fatal(err)
					}
					if got := id & 0xffff; got != c.want {
						t.Errorf("machine ID bits of %d = %d, want %d", id, got, c.want)
					}
					wantRedeemed(t, c.s.redeem(t, tok.Token, ""), tok.ID, token.DefaultPurpose, "") // leave nothing behind
				}
			})
			t.Run("a token issued on A redeems on B exactly once", func(t *testing.T) {
				tok := a.issue(t, `{"purpose":"transfer"}`)
				wantRedeemed(t, bb.redeem(t, tok.Token, `{"purpose":"transfer"}`), tok.ID, "transfer", "")
				wantProblem(t, bb.redeem(t, tok.Token, `{"purpose":"transfer"}`), http.StatusConflict, "token_used")
				wantProblem(t, a.redeem(t, tok.Token, `{"purpose":"transfer"}`), http.StatusConflict, "token_used")
			})
			t.Run("a purpose mismatch on A leaves the token for B", func(t *testing.T) {
				tok := a.issue(t, `{"purpose":"transfer"}`)
				wantProblem(t, a.redeem(t, tok.Token, `{"purpose":"login"}`), http.StatusForbidden, "purpose_mismatch")
				wantRedeemed(t, bb.redeem(t, tok.Token, `{"purpose":"transfer"}`), tok.ID, "transfer", "")
			})
			t.Run("A and B racing on the same tokens", func(t *testing.T) {
				raceRedemptions(t, twoInstanceTokens, a, bb)
			})
		})
	}
}

// TestTwoKeyRingsDoNotMix checks that instances sharing a store but not a
// key ring (two deployments on one Redis) refuse each other's tokens, even
// under the same kid.
func TestTwoKeyRingsDoNotMix(t *testing.T) {
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			prefix := uniquePrefix(t)
			a := startServer(t, b.open(t, prefix), serverConfig{keys: newKeys(t, "shared")})
			other := startServer(t, b.open(t, prefix), serverConfig{keys: newKeys(t, "shared")})
			tok := a.issue(t, "")
			wantProblem(t, other.redeem(t, tok.Token, ""), http.StatusUnauthorized, "token_invalid")
			wantRedeemed(t, a.redeem(t, tok.Token, ""), tok.ID, token.DefaultPurpose, "")
		})
	}
}
