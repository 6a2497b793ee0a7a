-- complete.sql: Store.Complete; see replayguard_complete in the migrations.
--
-- $1 key, $2 owner (empty for any), $3 response (bytea), $4 keep in
-- microseconds
SELECT replayguard_complete($1, $2, $3, $4)
