-- cleanup.sql: one batch of the background cleanup; see
-- replayguard_cleanup in the migrations. No rows: another session holds
-- the cleanup lock.
--
-- $1 the most rows to delete from each table
SELECT table_name, deleted FROM replayguard_cleanup($1)
