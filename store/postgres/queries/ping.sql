-- ping.sql: Store.Ping. Reads no row, but fails unless the database
-- answers and the store's table is there and readable: a readiness probe
-- catches a database that Migrate has not set up, or a missing grant.
SELECT FROM replayguard_tokens LIMIT 0
