package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/store/postgres"
	"github.com/replayguard/replayguard/store/storetest"
)

// TestConformanceLeastPrivilege runs the suite, with the background
// cleanup, as a role that has exactly the privileges the package
// documentation lists: USAGE on the schema, SELECT, INSERT, UPDATE and
// DELETE on the four tables, EXECUTE on the functions (PUBLIC's default).
// The schema is migrated by the test database's own user.
func TestConformanceLeastPrivilege(t *testing.T) {
	base, err := url.Parse(databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	role, password := "rgtest_role_"+hex.EncodeToString(b), hex.EncodeToString(b)+"-pw"
	ident := pgx.Identifier{role}.Sanitize()
	if err := tryAdmin(t, "CREATE ROLE "+ident+" LOGIN PASSWORD '"+password+"'"); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			t.Skipf("the test database's user may not create roles: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { admin(t, "DROP ROLE "+ident) })

	storetest.Run(t, func(t *testing.T) storetest.Instance {
		schema := newSchema(t)
		owner := newPool(t, schema, 2)
		if err := postgres.Migrate(context.Background(), owner); err != nil {
			t.Fatal(err)
		}
		s := pgx.Identifier{schema}.Sanitize()
		admin(t, "GRANT USAGE ON SCHEMA "+s+" TO "+ident)
		admin(t, "GRANT SELECT, INSERT, UPDATE, DELETE ON "+
			s+".replayguard_tokens, "+s+".replayguard_nonces, "+s+".replayguard_records, "+s+".replayguard_rate_limits TO "+ident)
		// DROP SCHEMA … CASCADE leaves the grants nothing to hold on to.

		u := *base
		u.User = url.UserPassword(role, password)
		cfg, err := pgxpool.ParseConfig(u.String())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		cfg.MaxConns = 16
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		st := postgres.New(pool, postgres.WithTimeout(loadedTimeout),
			postgres.WithCleanupInterval(20*time.Millisecond), postgres.WithCleanupBatch(3),
			postgres.WithCleanupReport(func(_ int64, err error) {
				if err != nil {
					t.Errorf("cleanup as %s: %v", role, err)
				}
			}))
		// TTLs are read as the owner: the store's role needs no more.
		return storetest.Instance{
			Store: st, Limiter: st, Now: time.Now, Advance: time.Sleep,
			TTL: ttl(t, owner, tokenTTLSQL), RecordTTL: ttl(t, owner, recordTTLSQL),
		}
	})
}

// tryAdmin is admin that returns the statement's error.
func tryAdmin(t *testing.T, sql string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL(t))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}
