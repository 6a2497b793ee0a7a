package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// writer is what a call that may change something sends its commands to:
// the store's client, or with WithMinReplicas one connection of it.
type writer interface {
	goredis.Scripter
	SetArgs(ctx context.Context, key string, value any, a goredis.SetArgs) *goredis.StatusCmd
}

var _ writer = (*goredis.Conn)(nil)

// waitMargin is the most of a call's remaining time that WAIT leaves
// unused, so that its answer (too few replicas) arrives before the
// call's deadline cuts the connection: Redis notices that a WAIT timed
// out on its next event-loop tick, up to 1000/hz ms (100ms by default)
// late.
const waitMargin = 150 * time.Millisecond

// change is one call that may change the key it was opened for. Without
// WithMinReplicas its commands go to the client, as they always did.
// With it they go to conn, one connection to the master that holds the
// key, so that confirm's WAIT on that connection counts the replicas
// that acknowledged this call's change and no other.
type change struct {
	w       writer
	conn    *goredis.Conn          // nil without WithMinReplicas
	cluster *goredis.ClusterClient // conn's cluster, told to reload its slots after an error
}

// open returns the change for a call on key (the Redis key, whose hash
// slot picks the Cluster node). Without WithMinReplicas it allocates
// nothing and sends nothing.
func (s *Store) open(ctx context.Context, key string) (change, error) {
	if s.minReplicas == 0 {
		return change{w: s.writer}, nil
	}
	switch c := s.client.(type) {
	case *goredis.Client: // a single server, or a FailoverClient
		conn := c.Conn()
		return change{w: conn, conn: conn}, nil
	case *goredis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			c.ReloadState(ctx)
			return change{}, err
		}
		conn := node.Conn()
		return change{w: conn, conn: conn, cluster: c}, nil
	}
	return change{}, fmt.Errorf("WithMinReplicas needs a *redis.Client or a *redis.ClusterClient, not a %T", s.client)
}

// close gives the pinned connection, if any, back to the client's pool
// (or drops it, when it failed).
func (c change) close() {
	if c.conn != nil {
		_ = c.conn.Close()
	}
}

// fail is the error of a change's call that did not complete. On a
// Cluster node's connection, which bypasses the ClusterClient's own
// redirection, the error may come from a slot that moved or a node that
// failed over: the client is told to reload its slot map (lazily, at
// most once per 200ms).
func (c change) fail(op string, err error) error {
	if c.cluster != nil {
		c.cluster.ReloadState(context.Background())
	}
	return fail(op, err)
}

// confirm waits, with WAIT on the change's connection, until
// s.minReplicas replicas have acknowledged its writes, for what is left
// of ctx's deadline less a margin (half of it, waitMargin at most).
// Without WithMinReplicas it returns nil at once. A change that fewer
// replicas acknowledged, or whose WAIT failed, is an error wrapping
// ErrNotReplicated: the master has made it, unconfirmed.
func (s *Store) confirm(ctx context.Context, op string, c change) error {
	if c.conn == nil {
		return nil
	}
	deadline, _ := ctx.Deadline() // begin always sets one
	left := time.Until(deadline)
	wait := (left - min(left/2, waitMargin)).Truncate(time.Millisecond)
	if wait <= 0 {
		// WAIT n 0 would block until n replicas answer: never send it.
		return fmt.Errorf("%w: redis: %s: no time left to wait for %d replicas", ErrNotReplicated, op, s.minReplicas)
	}
	n, err := c.conn.Wait(ctx, s.minReplicas, wait).Result()
	if err != nil {
		_ = c.fail(op, err) // reloads a cluster's slots
		return fmt.Errorf("%w: redis: %s: wait: %w", ErrNotReplicated, op, unprefixed{err})
	}
	if n < int64(s.minReplicas) {
		return fmt.Errorf("%w: redis: %s: %d of %d replicas acknowledged it within %v", ErrNotReplicated, op, n, s.minReplicas, wait)
	}
	return nil
}
