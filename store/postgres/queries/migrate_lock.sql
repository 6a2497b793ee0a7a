-- migrate_lock.sql: the lock every migration's transaction takes first, so
-- that instances starting at once on an empty database apply each
-- migration once, one after the other. Held until the transaction ends.
SELECT pg_advisory_xact_lock(1919382116, 0)
