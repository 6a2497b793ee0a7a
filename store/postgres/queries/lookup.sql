-- lookup.sql: the live record under key, with when it was opened (NULL
-- for a row opened before migration 002) and when it ends (Store.Lookup).
-- One read: it locks nothing and changes nothing. No row: no live record.
--
-- $1 key (bytea)
SELECT completed, fingerprint, owner, response, created_at, expires_at
FROM replayguard_records
WHERE key = $1 AND expires_at > clock_timestamp()
