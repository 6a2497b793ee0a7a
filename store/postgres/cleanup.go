package postgres

import (
	"context"
	"time"
)

// cleanupTimeout bounds each cleanup statement: one batch per table.
const cleanupTimeout = 30 * time.Second

// cleanupLoop sweeps every cleanupInterval until Close.
func (s *Store) cleanupLoop() {
	defer close(s.done)
	t := time.NewTicker(s.cleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopCtx.Done():
			return
		case <-t.C:
		}
		n, _, err := s.sweep(s.stopCtx, nil)
		if s.stopCtx.Err() != nil {
			return // Close canceled the sweep: nothing went wrong
		}
		if s.cleanupReport != nil {
			s.cleanupReport(n, err)
		}
	}
}

// sweep deletes expired rows, in statements that each delete at most
// cleanupBatch rows from each table (replayguard_cleanup), until every
// table's batch comes back short. busy is true when another session held
// the cleanup lock, which ends the sweep: one instance cleans at a time.
// onBatch, when not nil, is told each table's batch.
func (s *Store) sweep(ctx context.Context, onBatch func(table string, n int64)) (deleted int64, busy bool, err error) {
	for {
		full, locked, n, err := s.cleanupOnce(ctx, onBatch)
		deleted += n
		switch {
		case err != nil:
			return deleted, false, fail("cleanup", err)
		case !locked:
			return deleted, true, nil
		case !full:
			return deleted, false, nil
		}
	}
}

// cleanupOnce runs one replayguard_cleanup. locked is false when another
// session holds the cleanup lock; full is true when some table's batch
// was full, so that more expired rows may be left.
func (s *Store) cleanupOnce(ctx context.Context, onBatch func(table string, n int64)) (full, locked bool, deleted int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, cleanupSQL, int32(min(s.cleanupBatch, 1<<31-1)))
	if err != nil {
		return false, false, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			table string
			n     int64
		)
		if err := rows.Scan(&table, &n); err != nil {
			return false, false, 0, err
		}
		locked = true
		deleted += n
		full = full || n >= int64(s.cleanupBatch)
		if onBatch != nil {
			onBatch(table, n)
		}
	}
	if err := rows.Err(); err != nil {
		return false, false, 0, err // the function's transaction rolled back
	}
	return full, locked, deleted, nil
}
