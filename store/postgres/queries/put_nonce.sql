-- put_nonce.sql: record a nonce unless it is live (Store.Put of a
-- store.NonceKey). One INSERT … ON CONFLICT, as put_token.sql. One row
-- affected means the nonce is fresh.
--
-- $1 key (bytea: NonceKey without "\x00n"), $2 ttl in microseconds (> 0)
INSERT INTO replayguard_nonces AS n (key, expires_at)
VALUES ($1, clock_timestamp() + $2::bigint * interval '1 microsecond')
ON CONFLICT (key) DO UPDATE
    SET expires_at = excluded.expires_at
    WHERE n.expires_at <= clock_timestamp()
