-- release.sql: delete owner's processing record so that a retry runs
-- (Store.Release). One DELETE: it checks owner, state and expiry on the
-- row's latest version. One row affected means released.
--
-- $1 key, $2 owner (bytea; empty for any owner)
DELETE FROM replayguard_records
WHERE key = $1 AND NOT completed AND expires_at > clock_timestamp()
  AND ($2 = ''::bytea OR owner = $2)
