-- allow.sql: Store.Allow; see replayguard_allow in the migrations.
--
-- $1 key (bytea), $2 emission interval in microseconds, $3 burst (>= 1)
SELECT replayguard_allow($1, $2, $3)
