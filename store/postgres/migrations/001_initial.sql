-- 001_initial.sql: the tables and functions of Replayguard's PostgreSQL
-- store (store/postgres).
--
-- postgres.Migrate applies this file in one transaction, under the advisory
-- lock pg_advisory_xact_lock(1919382116, 0), and records it as version 1 in
-- replayguard_schema_migrations. A DBA may apply it by hand the same way.
--
-- Every name this file creates begins with replayguard_.
--
-- Keys, purposes, subjects, fingerprints and owners are bytea: they may
-- hold any bytes, NUL included, which text cannot.
--
-- Every expiry is set and compared on the database's clock,
-- clock_timestamp(), never the application's. A row is live while its
-- expires_at is after the clock: every statement treats a row whose
-- expires_at has passed as absent, before replayguard_cleanup deletes it.
-- Durations arrive in whole microseconds (bigint).

-- Tokens issued and not yet redeemed, under their ID.
CREATE TABLE replayguard_tokens (
    id         bytea       NOT NULL,
    purpose    bytea       NOT NULL,
    subject    bytea       NOT NULL, -- empty when unbound
    expires_at timestamptz NOT NULL,
    CONSTRAINT replayguard_tokens_pkey PRIMARY KEY (id)
);
CREATE INDEX replayguard_tokens_expires_at_idx ON replayguard_tokens (expires_at);

-- Nonces seen: set-if-absent markers. key is store.NonceKey(scope, nonce)
-- without its leading "\x00n": len(scope) || ':' || scope || ':' || nonce.
CREATE TABLE replayguard_nonces (
    key        bytea       NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT replayguard_nonces_pkey PRIMARY KEY (key)
);
CREATE INDEX replayguard_nonces_expires_at_idx ON replayguard_nonces (expires_at);

-- Records of executions. key is the caller's idempotency key, or for a
-- token's own record store.TokenRecordKey(id) = '\x0074' || id (no
-- caller's key begins with a NUL byte). A record is processing under a
-- lease until completed; completing replaces the lease with the retention.
CREATE TABLE replayguard_records (
    key         bytea       NOT NULL,
    completed   boolean     NOT NULL,
    fingerprint bytea       NOT NULL,
    owner       bytea       NOT NULL,
    response    bytea,                -- completed records only
    expires_at  timestamptz NOT NULL, -- the lease's end, then the retention's
    CONSTRAINT replayguard_records_pkey PRIMARY KEY (key)
);
CREATE INDEX replayguard_records_expires_at_idx ON replayguard_records (expires_at);

-- Rate limits (GCRA). tat is the theoretical arrival time: the moment the
-- key's bucket is full again. Once it has passed, the row means nothing
-- more than an absent one, and replayguard_cleanup deletes it.
CREATE TABLE replayguard_rate_limits (
    key bytea       NOT NULL,
    tat timestamptz NOT NULL,
    CONSTRAINT replayguard_rate_limits_pkey PRIMARY KEY (key)
);
CREATE INDEX replayguard_rate_limits_tat_idx ON replayguard_rate_limits (tat);

-- replayguard_redeem is store.Store.Redeem in one call: it answers from the
-- token's live record, or compares the token and then deletes it (empty
-- p_owner) or opens a processing record beside it.
--
-- A live record is answered without a lock: a duplicate only reads.
-- Otherwise every redemption of p_id queues on the token's row lock
-- (SELECT … FOR UPDATE) and reads the record again, with a snapshot taken
-- after the lock: one redemption at a time decides, so exactly one of any
-- number of concurrent callers gets Redeemed. Locks are taken token first,
-- record second, as in replayguard_complete.
--
-- result: 0 absent, 1 redeemed, 2 purpose mismatch, 3 subject mismatch,
-- 4 recorded. The record columns describe the record found (4) or opened
-- (1 with an owner), else they are false, '', '' and NULL.
CREATE FUNCTION replayguard_redeem(
    p_id bytea, p_purpose bytea, p_subject bytea, p_owner bytea, p_lease_us bigint)
RETURNS TABLE (result integer, completed boolean, fingerprint bytea, owner bytea, response bytea)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    c_nl    constant bytea := decode('0a', 'hex');
    -- store.TokenRecordKey(p_id)
    v_key   constant bytea := decode('0074', 'hex') || p_id;
    -- store.Token.Fingerprint of the caller's token
    v_fp    constant bytea := p_purpose || c_nl || p_subject;
    -- No stored purpose contains a newline: such a p_purpose matches none,
    -- neither a token's purpose nor the purpose part of a record's
    -- fingerprint.
    v_plain constant boolean := position(c_nl IN p_purpose) = 0;
    v_rec    replayguard_records;
    v_tok    replayguard_tokens;
    v_locked boolean := false;
    v_now    timestamptz;
BEGIN
    LOOP
        v_now := clock_timestamp();
        SELECT r.* INTO v_rec FROM replayguard_records r
        WHERE r.key = v_key AND r.expires_at > v_now;
        IF FOUND THEN
            IF v_plain AND v_rec.fingerprint = v_fp THEN
                RETURN QUERY SELECT 4, v_rec.completed, v_rec.fingerprint, v_rec.owner, v_rec.response;
            ELSIF v_plain AND substring(v_rec.fingerprint FROM 1 FOR length(p_purpose) + 1) = p_purpose || c_nl THEN
                RETURN QUERY SELECT 3, false, ''::bytea, ''::bytea, NULL::bytea;
            ELSE
                RETURN QUERY SELECT 2, false, ''::bytea, ''::bytea, NULL::bytea;
            END IF;
            RETURN;
        END IF;
        IF NOT v_locked THEN
            -- Queue behind any redemption of p_id in progress, then look
            -- at the record again: it may have opened one.
            SELECT t.* INTO v_tok FROM replayguard_tokens t WHERE t.id = p_id FOR UPDATE;
            v_locked := true;
            CONTINUE;
        END IF;

        IF v_tok.id IS NULL OR v_tok.expires_at <= v_now THEN
            RETURN QUERY SELECT 0, false, ''::bytea, ''::bytea, NULL::bytea;
        ELSIF v_tok.purpose <> p_purpose THEN
            RETURN QUERY SELECT 2, false, ''::bytea, ''::bytea, NULL::bytea;
        ELSIF v_tok.subject <> p_subject THEN
            RETURN QUERY SELECT 3, false, ''::bytea, ''::bytea, NULL::bytea;
        ELSIF p_owner = ''::bytea THEN
            DELETE FROM replayguard_tokens t WHERE t.id = p_id;
            RETURN QUERY SELECT 1, false, ''::bytea, ''::bytea, NULL::bytea;
        ELSIF p_lease_us <= 0 THEN
            -- A record set and expired at once: nothing is stored and the
            -- token stays live.
            RETURN QUERY SELECT 1, false, v_fp, p_owner, NULL::bytea;
        ELSE
            -- An expired record's row may still be there: take its place,
            -- unless its lease was renewed since it was read (then the loop
            -- answers from it).
            INSERT INTO replayguard_records AS r (key, completed, fingerprint, owner, response, expires_at)
            VALUES (v_key, false, v_fp, p_owner, NULL, v_now + p_lease_us * interval '1 microsecond')
            ON CONFLICT (key) DO UPDATE
                SET completed = false, fingerprint = excluded.fingerprint, owner = excluded.owner,
                    response = NULL, expires_at = excluded.expires_at
                WHERE r.expires_at <= v_now;
            IF NOT FOUND THEN
                CONTINUE;
            END IF;
            RETURN QUERY SELECT 1, false, v_fp, p_owner, NULL::bytea;
        END IF;
        RETURN;
    END LOOP;
END
$$;

-- replayguard_acquire is store.Store.Acquire in one call: it returns the
-- live record under p_key or, when there is none, opens a processing one.
--
-- A live record is answered by a read. Otherwise one INSERT … ON CONFLICT
-- DO UPDATE … WHERE expired claims the key: of concurrent callers exactly
-- one inserts (or replaces the expired row); the others find the winner's
-- row, which ON CONFLICT has locked for them, and the loop reads it with a
-- snapshot taken after that lock.
--
-- acquired is true when the record was opened; the other columns describe
-- the record opened or found.
CREATE FUNCTION replayguard_acquire(
    p_key bytea, p_fingerprint bytea, p_owner bytea, p_lease_us bigint)
RETURNS TABLE (acquired boolean, completed boolean, fingerprint bytea, owner bytea, response bytea)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    LOOP
        v_now := clock_timestamp();
        RETURN QUERY SELECT false, r.completed, r.fingerprint, r.owner, r.response
            FROM replayguard_records r WHERE r.key = p_key AND r.expires_at > v_now;
        IF FOUND THEN
            RETURN;
        END IF;
        IF p_lease_us <= 0 THEN
            -- Opened and expired at once: nothing is stored.
            RETURN QUERY SELECT true, false, p_fingerprint, p_owner, NULL::bytea;
            RETURN;
        END IF;
        INSERT INTO replayguard_records AS r (key, completed, fingerprint, owner, response, expires_at)
        VALUES (p_key, false, p_fingerprint, p_owner, NULL, v_now + p_lease_us * interval '1 microsecond')
        ON CONFLICT (key) DO UPDATE
            SET completed = false, fingerprint = excluded.fingerprint, owner = excluded.owner,
                response = NULL, expires_at = excluded.expires_at
            WHERE r.expires_at <= v_now;
        IF FOUND THEN
            RETURN QUERY SELECT true, false, p_fingerprint, p_owner, NULL::bytea;
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- replayguard_complete is store.Store.Complete in one call: it turns the
-- processing record under p_key held by p_owner (any owner when p_owner is
-- empty) into a completed one holding p_response, kept for p_keep_us from
-- now (a p_keep_us <= 0 deletes it), and for a token's record
-- ('\x0074' || id) deletes the token id too. It returns whether it did.
--
-- For a token's record it locks the token first, as replayguard_redeem
-- does, then the record (by the UPDATE): one lock order, no deadlock.
CREATE FUNCTION replayguard_complete(
    p_key bytea, p_owner bytea, p_response bytea, p_keep_us bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_token bytea; -- the token whose record p_key is, else NULL
    v_now   timestamptz;
BEGIN
    IF substring(p_key FROM 1 FOR 2) = decode('0074', 'hex') THEN
        v_token := substring(p_key FROM 3);
        PERFORM FROM replayguard_tokens t WHERE t.id = v_token FOR UPDATE;
    END IF;
    v_now := clock_timestamp();
    IF p_keep_us > 0 THEN
        UPDATE replayguard_records r
        SET completed = true, response = p_response,
            expires_at = v_now + p_keep_us * interval '1 microsecond'
        WHERE r.key = p_key AND NOT r.completed AND r.expires_at > v_now
          AND (p_owner = ''::bytea OR r.owner = p_owner);
    ELSE
        DELETE FROM replayguard_records r
        WHERE r.key = p_key AND NOT r.completed AND r.expires_at > v_now
          AND (p_owner = ''::bytea OR r.owner = p_owner);
    END IF;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_token IS NOT NULL THEN
        DELETE FROM replayguard_tokens t WHERE t.id = v_token;
    END IF;
    RETURN true;
END
$$;

-- replayguard_allow is store.Limiter.Allow in one call: GCRA, as
-- go-redis/redis_rate computes it, on the database's clock. An event is
-- allowed when the key's backlog, tat - now, is at most (p_burst - 1)
-- emission intervals; it then moves tat one interval on. It returns 0 when
-- the event was allowed, else how many microseconds until one would be.
--
-- The claim is one INSERT … ON CONFLICT DO UPDATE … WHERE allowed; a
-- refused event writes nothing and reads the row ON CONFLICT locked.
CREATE FUNCTION replayguard_allow(p_key bytea, p_interval_us bigint, p_burst bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   constant timestamptz := clock_timestamp();
    v_t     constant interval := p_interval_us * interval '1 microsecond';
    v_slack constant interval := (greatest(p_burst, 1) - 1) * v_t;
    v_tat   timestamptz;
BEGIN
    INSERT INTO replayguard_rate_limits AS l (key, tat) VALUES (p_key, v_now + v_t)
    ON CONFLICT (key) DO UPDATE SET tat = greatest(l.tat, v_now) + v_t
        WHERE greatest(l.tat, v_now) - v_now <= v_slack;
    IF FOUND THEN
        RETURN 0;
    END IF;
    SELECT l.tat INTO v_tat FROM replayguard_rate_limits l WHERE l.key = p_key;
    RETURN greatest(ceil(extract(epoch FROM v_tat - v_now - v_slack) * 1000000), 1)::bigint;
END
$$;

-- replayguard_cleanup deletes at most p_batch expired rows from each table,
-- and returns how many it deleted from which. It returns no rows when
-- another session is cleaning the same tables: the transaction-level
-- advisory lock (1919382116, oid of replayguard_tokens) admits one
-- cleaner at a time. Each batch locks the expired rows it picks (FOR UPDATE
-- SKIP LOCKED: a row a request holds is skipped, never waited for), so no
-- request can revive a picked row before the DELETE removes exactly that
-- row version by its ctid.
CREATE FUNCTION replayguard_cleanup(p_batch integer)
RETURNS TABLE (table_name text, deleted bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now constant timestamptz := clock_timestamp();
    v_n   bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(1919382116, 'replayguard_tokens'::regclass::oid::integer) THEN
        RETURN;
    END IF;

    DELETE FROM replayguard_tokens t
    WHERE t.ctid = ANY (ARRAY(
        SELECT x.ctid FROM replayguard_tokens x WHERE x.expires_at <= v_now
        LIMIT p_batch FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN QUERY SELECT 'replayguard_tokens'::text, v_n;

    DELETE FROM replayguard_nonces t
    WHERE t.ctid = ANY (ARRAY(
        SELECT x.ctid FROM replayguard_nonces x WHERE x.expires_at <= v_now
        LIMIT p_batch FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN QUERY SELECT 'replayguard_nonces'::text, v_n;

    DELETE FROM replayguard_records t
    WHERE t.ctid = ANY (ARRAY(
        SELECT x.ctid FROM replayguard_records x WHERE x.expires_at <= v_now
        LIMIT p_batch FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN QUERY SELECT 'replayguard_records'::text, v_n;

    DELETE FROM replayguard_rate_limits t
    WHERE t.ctid = ANY (ARRAY(
        SELECT x.ctid FROM replayguard_rate_limits x WHERE x.tat <= v_now
        LIMIT p_batch FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN QUERY SELECT 'replayguard_rate_limits'::text, v_n;
END
$$;
