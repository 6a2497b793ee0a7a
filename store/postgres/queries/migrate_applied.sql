-- migrate_applied.sql: whether migration $1 has been applied.
SELECT EXISTS (SELECT FROM replayguard_schema_migrations WHERE version = $1)
