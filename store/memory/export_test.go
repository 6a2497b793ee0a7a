package memory

import "time"

// Len returns how many entries the store holds, counting expired entries
// the janitor has not removed yet (Usage().Entries, as an int).
func (s *Store) Len() int { return int(s.all.n.Load()) }

// TTL returns how long the live entry under key has left, and false when
// there is none.
func (s *Store) TTL(key string) (time.Duration, bool) {
	now := s.now().UnixNano()
	sh := &s.shards[s.shardIndex(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[key]
	if !ok || e.exp <= now {
		return 0, false
	}
	return time.Duration(e.exp - now), true
}

// RecordTTL returns how long the live record under key has left, and
// false when there is none.
func (s *Store) RecordTTL(key string) (time.Duration, bool) { return s.TTL(recordKey(key)) }
