-- migrate_table.sql: the table of applied migrations, created under the
-- migration lock before the first one.
CREATE TABLE IF NOT EXISTS replayguard_schema_migrations (
    version    integer     NOT NULL,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT replayguard_schema_migrations_pkey PRIMARY KEY (version)
)
