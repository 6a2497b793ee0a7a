-- The orders example's own tables. setup runs this file in one
-- transaction, under an advisory lock of the example's, so that instances
-- that start at once on an empty database do not race on CREATE TABLE.
-- Replayguard's tables (replayguard_records and the rest) come from
-- store/postgres's Migrate, which setup runs next.
SELECT pg_advisory_xact_lock(hashtext('replayguard examples/orders schema'));

CREATE TABLE IF NOT EXISTS orders (
    id         bigserial PRIMARY KEY,
    item       text NOT NULL,
    qty        int NOT NULL,
    state      text NOT NULL,
    version    int NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS payments (
    order_id bigint NOT NULL REFERENCES orders,
    paid_at  timestamptz NOT NULL DEFAULT now()
);
