-- 002_record_created.sql: when each record was opened, for
-- store.Store.Lookup (an operator's view of a record).
--
-- postgres.Migrate applies this file as it applies 001: in one
-- transaction, under the advisory lock pg_advisory_xact_lock(1919382116,
-- 0), and records it as version 2 in replayguard_schema_migrations. A DBA
-- may apply it by hand the same way.
--
-- replayguard_records gains created_at: the database's clock_timestamp()
-- when replayguard_acquire or replayguard_redeem opened the record (or
-- took an expired row's place). Renewing and completing keep it. Rows
-- opened before this migration keep a NULL created_at until their key is
-- opened again; the store reports it as a zero store.Record.Created.
--
-- Adding a column without a default changes only the catalog, at once,
-- whatever the table's size; but ALTER TABLE takes the table's ACCESS
-- EXCLUSIVE lock: it waits for every transaction that has touched
-- replayguard_records to end, and the store's statements queue behind
-- it meanwhile. The store's own statements are short; a transaction of
-- idempotency/pgtx holds the table until the application commits it.
-- Apply it when no long transaction is open on the table, or give the
-- migrating role a lock_timeout (ALTER ROLE … SET lock_timeout): the
-- migration then fails instead of waiting, and is tried again.
--
-- The two functions that open records are replaced, with the same
-- signatures, to set created_at; their comments in 001 still describe
-- them.

ALTER TABLE replayguard_records ADD COLUMN created_at timestamptz; -- NULL: opened before 002

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
CREATE OR REPLACE FUNCTION replayguard_redeem(
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
            INSERT INTO replayguard_records AS r (key, completed, fingerprint, owner, response, expires_at, created_at)
            VALUES (v_key, false, v_fp, p_owner, NULL, v_now + p_lease_us * interval '1 microsecond', v_now)
            ON CONFLICT (key) DO UPDATE
                SET completed = false, fingerprint = excluded.fingerprint, owner = excluded.owner,
                    response = NULL, expires_at = excluded.expires_at, created_at = excluded.created_at
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
CREATE OR REPLACE FUNCTION replayguard_acquire(
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
        INSERT INTO replayguard_records AS r (key, completed, fingerprint, owner, response, expires_at, created_at)
        VALUES (p_key, false, p_fingerprint, p_owner, NULL, v_now + p_lease_us * interval '1 microsecond', v_now)
        ON CONFLICT (key) DO UPDATE
            SET completed = false, fingerprint = excluded.fingerprint, owner = excluded.owner,
                response = NULL, expires_at = excluded.expires_at, created_at = excluded.created_at
            WHERE r.expires_at <= v_now;
        IF FOUND THEN
            RETURN QUERY SELECT true, false, p_fingerprint, p_owner, NULL::bytea;
            RETURN;
        END IF;
    END LOOP;
END
$$;
