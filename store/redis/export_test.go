package redis

// TokenKey, RecordKey and PutKey expose the store's key layout to tests.
func (s *Store) TokenKey(id string) string   { return s.tokenKey(id) }
func (s *Store) RecordKey(key string) string { return s.recordKey(key) }
func (s *Store) PutKey(key string) string    { return s.putKey(key) }
