package redis

// TokenKey, RecordKey and PutKey expose the store's key layout to tests.
func (s *Store) TokenKey(id string) string   { return s.tokenKey(id) }
func (s *Store) RecordKey(key string) string { return s.recordKey(key) }
func (s *Store) PutKey(key string) string    { return s.putKey(key) }

// BatchState reports the state of the store's pipelining (WithPipelining):
// the senders running, the commands queued, and how many queued calls
// have armed a timer of their own. A store that does not pipeline
// reports zeros.
func (s *Store) BatchState() (running, queued int, timers int64) {
	bw, ok := s.writer.(batchWriter)
	if !ok {
		return 0, 0, 0
	}
	bw.b.mu.Lock()
	defer bw.b.mu.Unlock()
	return bw.b.running, len(bw.b.queue), bw.b.timers.Load()
}
