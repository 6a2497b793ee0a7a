-- redeem.sql: Store.Redeem; see replayguard_redeem in the migrations.
--
-- $1 id, $2 purpose, $3 subject, $4 owner (bytea), $5 lease in microseconds
SELECT result, completed, fingerprint, owner, response
FROM replayguard_redeem($1, $2, $3, $4, $5)
