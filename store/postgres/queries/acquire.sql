-- acquire.sql: Store.Acquire; see replayguard_acquire in the migrations.
--
-- $1 key, $2 fingerprint, $3 owner (bytea), $4 lease in microseconds
SELECT acquired, completed, fingerprint, owner, response
FROM replayguard_acquire($1, $2, $3, $4)
