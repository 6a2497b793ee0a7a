-- renew.sql: move the end of owner's processing lease (Store.Renew). One
-- UPDATE: it locks the row and checks owner, state and expiry on its
-- latest version. A lease <= 0 (0 here) sets an expiry that has passed:
-- the record is absent from then on. One row affected means renewed.
--
-- $1 key, $2 owner (bytea, never empty), $3 lease in microseconds
UPDATE replayguard_records
SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
WHERE key = $1 AND owner = $2 AND NOT completed AND expires_at > clock_timestamp()
