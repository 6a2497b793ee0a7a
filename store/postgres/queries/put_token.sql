-- put_token.sql: store a token unless a live one holds its ID (Store.Put).
-- One INSERT … ON CONFLICT: of concurrent callers exactly one inserts, or
-- replaces an expired row; for a live row the WHERE is false and nothing
-- changes. One row affected means created.
--
-- $1 id, $2 purpose, $3 subject (bytea), $4 ttl in microseconds (> 0)
INSERT INTO replayguard_tokens AS t (id, purpose, subject, expires_at)
VALUES ($1, $2, $3, clock_timestamp() + $4::bigint * interval '1 microsecond')
ON CONFLICT (id) DO UPDATE
    SET purpose = excluded.purpose, subject = excluded.subject, expires_at = excluded.expires_at
    WHERE t.expires_at <= clock_timestamp()
