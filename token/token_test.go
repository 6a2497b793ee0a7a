package token_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

var (
	keyA = token.Key{ID: "a", Secret: []byte(strings.Repeat("A", 32))}
	keyB = token.Key{ID: "b", Secret: []byte(strings.Repeat("B", 32))}
)

// countingStore counts the calls that reach the store.
type countingStore struct {
	store.Store
	calls   atomic.Int64
	lastTTL atomic.Int64 // of the last Put
}

func (c *countingStore) Put(ctx context.Context, id string, t store.Token, ttl time.Duration) (bool, error) {
	c.calls.Add(1)
	c.lastTTL.Store(int64(ttl))
	return c.Store.Put(ctx, id, t, ttl)
}

func (c *countingStore) Redeem(ctx context.Context, id string, t store.Token, owner string, lease time.Duration) (store.RedeemResult, store.Record, error) {
	c.calls.Add(1)
	return c.Store.Redeem(ctx, id, t, owner, lease)
}

// brokenStore fails every call, as a store that cannot be reached does.
type brokenStore struct{ store.Store }

var errBroken = store.Unavailable("test", errors.New("connection refused"))

func (brokenStore) Put(context.Context, string, store.Token, time.Duration) (bool, error) {
	return false, errBroken
}

func (brokenStore) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return 0, store.Record{}, errBroken
}

// answerStore answers every redemption with res.
type answerStore struct {
	store.Store
	res store.RedeemResult
}

func (a *answerStore) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return a.res, store.Record{}, nil
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type fixture struct {
	svc   *token.Service
	store *countingStore
	clock *clock
}

func newFixture(t testing.TB, keys ...token.Key) fixture {
	t.Helper()
	if len(keys) == 0 {
		keys = []token.Key{keyA}
	}
	c := &clock{t: time.Now().Truncate(time.Second)}
	mem := memory.New(memory.WithClock(c.Now))
	t.Cleanup(func() { _ = mem.Close() })
	cs := &countingStore{Store: mem}
	svc, err := token.New(cs, keys, token.WithClock(c.Now), token.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	return fixture{svc: svc, store: cs, clock: c}
}

func (f fixture) issue(t testing.TB, req token.IssueRequest) token.Issued {
	t.Helper()
	is, err := f.svc.Issue(context.Background(), req)
	if err != nil {
		t.Fatalf("Issue(%+v): %v", req, err)
	}
	return is
}

func TestIssueThenRedeemOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	is := f.issue(t, token.IssueRequest{})
	if is.Purpose != token.DefaultPurpose || is.ExpiresAt.Sub(is.IssuedAt) != token.DefaultTTL {
		t.Fatalf("issued %+v; want default purpose and TTL", is.Claims)
	}
	c, err := f.svc.Redeem(ctx, is.Token, "", "")
	if err != nil {
		t.Fatalf("first redeem: %v", err)
	}
	if c.ID != is.ID {
		t.Fatalf("redeemed ID %s, issued %s", c.ID, is.ID)
	}
	if _, err := f.svc.Redeem(ctx, is.Token, "", ""); !errors.Is(err, token.ErrUsed) {
		t.Fatalf("second redeem: %v, want ErrUsed", err)
	}
}

func TestJWTShape(t *testing.T) {
	f := newFixture(t)
	is := f.issue(t, token.IssueRequest{Purpose: "checkout", Subject: "alice", TTL: time.Minute})
	var claims jwt.MapClaims
	tok, _, err := jwt.NewParser().ParseUnverified(is.Token, &claims)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Header["alg"] != "HS256" || tok.Header["kid"] != "a" {
		t.Fatalf("header = %v", tok.Header)
	}
	for _, k := range []string{"jti", "iat", "exp", "pur", "sub"} {
		if _, ok := claims[k]; !ok {
			t.Errorf("claim %s missing: %v", k, claims)
		}
	}
	if claims["pur"] != "checkout" || claims["sub"] != "alice" || claims["jti"] != is.ID {
		t.Fatalf("claims = %v", claims)
	}
	if exp := claims["exp"].(float64); int64(exp) != is.ExpiresAt.Unix() {
		t.Fatalf("exp = %v, want %d", exp, is.ExpiresAt.Unix())
	}
	if ttl := time.Duration(f.store.lastTTL.Load()); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("stored for %v; want at most the token's minute", ttl)
	}
}

// sign makes an HS256-shaped token by hand, so tests can forge any header.
func sign(header, claims string, secret []byte) string {
	enc := base64.RawURLEncoding
	unsigned := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(claims))
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(unsigned))
	return unsigned + "." + enc.EncodeToString(mac.Sum(nil))
}

func TestRejectedBeforeTheStore(t *testing.T) {
	f := newFixture(t)
	good := f.issue(t, token.IssueRequest{})
	now := f.clock.Now().Unix()
	claims := func(extra string) string {
		return `{"jti":"123","iat":` + itoa(now) + `,"exp":` + itoa(now+60) + `,"pur":"default"` + extra + `}`
	}
	parts := strings.Split(good.Token, ".")
	tests := []struct {
		name string
		tok  string
		want error
	}{
		{"empty token", "", token.ErrInvalid},
		{"garbage", "not-a-jwt", token.ErrInvalid},
		{"oversized token", strings.Repeat("a", token.MaxTokenLen) + ".b.c", token.ErrInvalid},
		{"alg none", base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"a"}`)) + "." + parts[1] + ".", token.ErrInvalid},
		{"HS384 with the right key", func() string {
			tk := jwt.NewWithClaims(jwt.SigningMethodHS384, jwt.MapClaims{"jti": "1", "iat": now, "exp": now + 60, "pur": "default"})
			tk.Header["kid"] = "a"
			s, _ := tk.SignedString(keyA.Secret)
			return s
		}(), token.ErrInvalid},
		{"signed with another key, current kid", sign(`{"alg":"HS256","kid":"a"}`, claims(""), keyB.Secret), token.ErrInvalid},
		{"unknown kid", sign(`{"alg":"HS256","kid":"zz"}`, claims(""), keyA.Secret), token.ErrInvalid},
		{"no kid", sign(`{"alg":"HS256"}`, claims(""), keyA.Secret), token.ErrInvalid},
		{"tampered claims", parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(claims(""))) + "." + parts[2], token.ErrInvalid},
		{"missing jti", sign(`{"alg":"HS256","kid":"a"}`, `{"iat":`+itoa(now)+`,"exp":`+itoa(now+60)+`,"pur":"default"}`, keyA.Secret), token.ErrInvalid},
		{"non-numeric jti", sign(`{"alg":"HS256","kid":"a"}`, `{"jti":"x","iat":`+itoa(now)+`,"exp":`+itoa(now+60)+`,"pur":"default"}`, keyA.Secret), token.ErrInvalid},
		{"missing exp", sign(`{"alg":"HS256","kid":"a"}`, `{"jti":"1","iat":`+itoa(now)+`,"pur":"default"}`, keyA.Secret), token.ErrInvalid},
		{"bad purpose claim", sign(`{"alg":"HS256","kid":"a"}`, `{"jti":"1","iat":`+itoa(now)+`,"exp":`+itoa(now+60)+`,"pur":"a b"}`, keyA.Secret), token.ErrInvalid},
		{"expired beyond the leeway", sign(`{"alg":"HS256","kid":"a"}`, `{"jti":"1","iat":`+itoa(now-100)+`,"exp":`+itoa(now-6)+`,"pur":"default"}`, keyA.Secret), token.ErrExpired},
		{"expired with a bad signature is invalid", sign(`{"alg":"HS256","kid":"a"}`, `{"jti":"1","iat":`+itoa(now-100)+`,"exp":`+itoa(now-60)+`,"pur":"default"}`, keyB.Secret), token.ErrInvalid},
		{"purpose mismatch from the signed claim", good.Token, token.ErrPurposeMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := f.store.calls.Load()
			purpose := ""
			if tc.want == token.ErrPurposeMismatch {
				purpose = "other"
			}
			_, err := f.svc.Redeem(context.Background(), tc.tok, purpose, "")
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if n := f.store.calls.Load() - before; n != 0 {
				t.Fatalf("store was called %d times", n)
			}
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestExpiry(t *testing.T) {
	ctx := context.Background()
	t.Run("inside the leeway but gone from the store is expired, not used", func(t *testing.T) {
		f := newFixture(t)
		is := f.issue(t, token.IssueRequest{TTL: 10 * time.Second})
		f.clock.Advance(12 * time.Second)
		if _, err := f.svc.Redeem(ctx, is.Token, "", ""); !errors.Is(err, token.ErrExpired) {
			t.Fatalf("err = %v, want ErrExpired", err)
		}
	})
	t.Run("past the leeway is expired before the store is touched", func(t *testing.T) {
		f := newFixture(t)
		is := f.issue(t, token.IssueRequest{TTL: 10 * time.Second})
		f.clock.Advance(16 * time.Second)
		before := f.store.calls.Load()
		if _, err := f.svc.Redeem(ctx, is.Token, "", ""); !errors.Is(err, token.ErrExpired) {
			t.Fatalf("err = %v, want ErrExpired", err)
		}
		if f.store.calls.Load() != before {
			t.Fatal("store was called")
		}
	})
	t.Run("just before exp redeems", func(t *testing.T) {
		f := newFixture(t)
		is := f.issue(t, token.IssueRequest{TTL: 10 * time.Second})
		f.clock.Advance(9 * time.Second)
		if _, err := f.svc.Redeem(ctx, is.Token, "", ""); err != nil {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestBinding(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name              string
		issuePurpose      string
		issueSubject      string
		redeemPurpose     string
		redeemSubject     string
		want              error
		stillRedeemableAs [2]string
	}{
		{"matching purpose and subject", "checkout", "alice", "checkout", "alice", nil, [2]string{}},
		{"omitted purpose means default", "", "", "", "", nil, [2]string{}},
		{"other purpose", "checkout", "", "login", "", token.ErrPurposeMismatch, [2]string{"checkout", ""}},
		{"redeem without purpose of a purposed token", "checkout", "", "", "", token.ErrPurposeMismatch, [2]string{"checkout", ""}},
		{"other subject", "checkout", "alice", "checkout", "bob", token.ErrSubjectMismatch, [2]string{"checkout", "alice"}},
		{"bound token without subject", "checkout", "alice", "checkout", "", token.ErrSubjectMismatch, [2]string{"checkout", "alice"}},
		{"unbound token with a subject", "checkout", "", "checkout", "alice", token.ErrSubjectMismatch, [2]string{"checkout", ""}},
		{"malformed purpose on redeem", "checkout", "", "bad purpose!", "", token.ErrBadRequest, [2]string{"checkout", ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			is := f.issue(t, token.IssueRequest{Purpose: tc.issuePurpose, Subject: tc.issueSubject})
			_, err := f.svc.Redeem(ctx, is.Token, tc.redeemPurpose, tc.redeemSubject)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want != nil {
				if _, err := f.svc.Redeem(ctx, is.Token, tc.stillRedeemableAs[0], tc.stillRedeemableAs[1]); err != nil {
					t.Fatalf("token did not stay valid: %v", err)
				}
			}
		})
	}
}

func TestIssueValidation(t *testing.T) {
	tests := []struct {
		name string
		req  token.IssueRequest
		want error
	}{
		{"purpose with a space", token.IssueRequest{Purpose: "a b"}, token.ErrBadRequest},
		{"purpose of 65 characters", token.IssueRequest{Purpose: strings.Repeat("p", 65)}, token.ErrBadRequest},
		{"purpose of 64 characters", token.IssueRequest{Purpose: strings.Repeat("p", 64)}, nil},
		{"purpose with every allowed punctuation", token.IssueRequest{Purpose: "a.b_c:d/e-f"}, nil},
		{"ttl below 10s", token.IssueRequest{TTL: 9 * time.Second}, token.ErrBadRequest},
		{"ttl of 10s", token.IssueRequest{TTL: 10 * time.Second}, nil},
		{"ttl of the max", token.IssueRequest{TTL: time.Hour}, nil},
		{"ttl above the max", token.IssueRequest{TTL: time.Hour + time.Second}, token.ErrBadRequest},
		{"oversized subject", token.IssueRequest{Subject: strings.Repeat("s", token.MaxSubjectLen+1)}, token.ErrBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			_, err := f.svc.Issue(context.Background(), tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestStoreFailureIsUnavailable(t *testing.T) {
	svc, err := token.New(brokenStore{}, []token.Key{keyA}, token.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Issue(context.Background(), token.IssueRequest{}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("issue: %v, want store.ErrUnavailable", err)
	}
	f := newFixture(t)
	is := f.issue(t, token.IssueRequest{})
	if _, err := svc.Redeem(context.Background(), is.Token, "", ""); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("redeem: %v, want store.ErrUnavailable", err)
	}
	if _, _, _, err := svc.RedeemRecord(context.Background(), is.Token, "", "", "owner", time.Minute); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("redeem with a record: %v, want store.ErrUnavailable", err)
	}
}

func TestKeyRotation(t *testing.T) {
	old := newFixture(t, keyA)
	is := old.issue(t, token.IssueRequest{})
	// The new ring signs with B and still verifies A, on the same store.
	rotated, err := token.New(old.store, []token.Key{keyB, keyA}, token.WithClock(old.clock.Now), token.WithMachineID(2))
	if err != nil {
		t.Fatal(err)
	}
	if rotated.SigningKeyID() != "b" {
		t.Fatalf("signing kid = %s", rotated.SigningKeyID())
	}
	if _, err := rotated.Redeem(context.Background(), is.Token, "", ""); err != nil {
		t.Fatalf("old token after rotation: %v", err)
	}
	// Once A is retired, its tokens are invalid.
	retired := newFixture(t, keyB)
	is2 := old.issue(t, token.IssueRequest{})
	if _, err := retired.svc.Parse(is2.Token); !errors.Is(err, token.ErrInvalid) {
		t.Fatalf("token of a retired key: %v", err)
	}
}

func TestParseKeys(t *testing.T) {
	k32 := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))
	k31 := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 31)))
	tests := []struct {
		name    string
		spec    string
		wantIDs []string
		wantErr bool
	}{
		{"one key", "k1:" + k32, []string{"k1"}, false},
		{"two keys, first signs", "new:" + k32 + ",old:" + k32, []string{"new", "old"}, false},
		{"padding optional", "k1:" + strings.TrimRight(k32, "="), []string{"k1"}, false},
		{"spaces around entries", " k1:" + k32 + " , k2:" + k32, []string{"k1", "k2"}, false},
		{"short key", "k1:" + k31, nil, true},
		{"duplicate kid", "k1:" + k32 + ",k1:" + k32, nil, true},
		{"bad base64", "k1:@@@@" + k32, nil, true},
		{"url-safe base64 is not standard", "k1:" + strings.NewReplacer("+", "-", "/", "_").Replace(base64.StdEncoding.EncodeToString(make([]byte, 30))+"-_-_"), nil, true},
		{"missing colon", k32, nil, true},
		{"empty kid", ":" + k32, nil, true},
		{"empty", "", nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := token.ParseKeys(tc.spec)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil {
				if !errors.Is(err, token.ErrBadKeys) {
					t.Fatalf("err = %v, want ErrBadKeys", err)
				}
				if strings.Contains(err.Error(), k32[:10]) {
					t.Fatalf("error leaks key material: %v", err)
				}
				return
			}
			if len(keys) != len(tc.wantIDs) {
				t.Fatalf("got %d keys, want %v", len(keys), tc.wantIDs)
			}
			for i, k := range keys {
				if k.ID != tc.wantIDs[i] || len(k.Secret) != 32 {
					t.Fatalf("key %d = %v (%d bytes)", i, k, len(k.Secret))
				}
			}
		})
	}
}

func TestConcurrentRedeem(t *testing.T) {
	f := newFixture(t)
	is := f.issue(t, token.IssueRequest{})
	var ok, used atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.svc.Redeem(context.Background(), is.Token, "", "")
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, token.ErrUsed):
				used.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1 || used.Load() != 49 {
		t.Fatalf("ok=%d used=%d, want 1 and 49", ok.Load(), used.Load())
	}
}

func TestSubjectsThatJSONEscapeStillRedeem(t *testing.T) {
	f := newFixture(t)
	subject := strings.Repeat("<", token.MaxSubjectLen) // each byte becomes \u003c
	is := f.issue(t, token.IssueRequest{Subject: subject})
	if _, err := f.svc.Redeem(context.Background(), is.Token, "", subject); err != nil {
		t.Fatalf("a token the service issued does not redeem (%d bytes): %v", len(is.Token), err)
	}
}

func TestInvalidUTF8SubjectIsRefused(t *testing.T) {
	f := newFixture(t)
	if _, err := f.svc.Issue(context.Background(), token.IssueRequest{Subject: "u\xff"}); !errors.Is(err, token.ErrBadRequest) {
		t.Fatalf("err = %v, want ErrBadRequest", err)
	}
}

func TestLifetimeIsAtLeastTheTTL(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 999_000_000)} // just before a second ends
	mem := memory.New(memory.WithClock(c.Now))
	t.Cleanup(func() { _ = mem.Close() })
	cs := &countingStore{Store: mem}
	svc, err := token.New(cs, []token.Key{keyA}, token.WithClock(c.Now), token.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	is, err := svc.Issue(context.Background(), token.IssueRequest{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if life := is.ExpiresAt.Sub(c.Now()); life < 10*time.Second || life >= 11*time.Second || is.TTL != 10*time.Second {
		t.Fatalf("lifetime %v, TTL %v; want [10s, 11s) and 10s", life, is.TTL)
	}
	if ttl := time.Duration(cs.lastTTL.Load()); !c.Now().Add(ttl).Equal(is.ExpiresAt) {
		t.Fatalf("stored entry kept for %v, until %v; the token expires at %v", ttl, c.Now().Add(ttl), is.ExpiresAt)
	}
}

func TestRefusalsFromTheClaimsLeaveTheStoreAlone(t *testing.T) {
	f := newFixture(t)
	is := f.issue(t, token.IssueRequest{Purpose: "checkout", Subject: "alice"})
	tests := []struct {
		name             string
		tok              string
		purpose, subject string
		want             error
	}{
		{"another purpose", is.Token, "login", "alice", token.ErrPurposeMismatch},
		{"another subject", is.Token, "checkout", "bob", token.ErrSubjectMismatch},
		{"a malformed purpose", is.Token, "a b", "alice", token.ErrBadRequest},
		{"a forged token", "a.b.c", "checkout", "alice", token.ErrInvalid},
	}
	before := f.store.calls.Load()
	for _, tc := range tests {
		if _, err := f.svc.Redeem(context.Background(), tc.tok, tc.purpose, tc.subject); !errors.Is(err, tc.want) {
			t.Fatalf("%s: Redeem err = %v, want %v", tc.name, err, tc.want)
		}
		if _, _, _, err := f.svc.RedeemRecord(context.Background(), tc.tok, tc.purpose, tc.subject, "owner", time.Minute); !errors.Is(err, tc.want) {
			t.Fatalf("%s: RedeemRecord err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if n := f.store.calls.Load() - before; n != 0 {
		t.Fatalf("refusals called the store %d times", n)
	}
	if _, err := f.svc.Redeem(context.Background(), is.Token, "checkout", "alice"); err != nil {
		t.Fatalf("the refused token no longer redeems: %v", err)
	}
}

func TestStoreAnswers(t *testing.T) {
	tests := []struct {
		name    string
		res     store.RedeemResult
		advance time.Duration
		want    error
	}{
		{"redeemed", store.Redeemed, 0, nil},
		{"purpose mismatch", store.PurposeMismatch, 0, token.ErrPurposeMismatch},
		{"subject mismatch", store.SubjectMismatch, 0, token.ErrSubjectMismatch},
		{"absent before exp is used", store.Absent, 0, token.ErrUsed},
		{"taken by its record is used", store.Recorded, 0, token.ErrUsed},
		{"an unknown result is unavailable", store.RedeemResult(99), 0, store.ErrUnavailable},
		{"absent inside the leeway after exp is expired", store.Absent, 10*time.Second + 2*time.Second, token.ErrExpired},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{t: time.Now().Truncate(time.Second)}
			mem := memory.New(memory.WithClock(c.Now))
			t.Cleanup(func() { _ = mem.Close() })
			ans := &answerStore{Store: mem}
			svc, err := token.New(ans, []token.Key{keyA}, token.WithClock(c.Now), token.WithMachineID(1))
			if err != nil {
				t.Fatal(err)
			}
			is, err := svc.Issue(context.Background(), token.IssueRequest{TTL: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			c.Advance(tc.advance)
			ans.res = tc.res
			if _, err := svc.Redeem(context.Background(), is.Token, "", ""); !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Fatalf("Redeem = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestRedeemRecord(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	is := f.issue(t, token.IssueRequest{Purpose: "checkout", TTL: 10 * time.Second})

	c, rec, found, err := f.svc.RedeemRecord(ctx, is.Token, "checkout", "", "owner-1", time.Minute)
	if err != nil || found || c.ID != is.ID || rec.Owner != "owner-1" || rec.Completed {
		t.Fatalf("first = %+v, %+v, %v, %v; want the claims and owner-1's processing record", c, rec, found, err)
	}
	// A duplicate finds the record, with or without an owner of its own.
	for _, owner := range []string{"owner-2", ""} {
		if _, rec, found, err := f.svc.RedeemRecord(ctx, is.Token, "checkout", "", owner, time.Minute); err != nil || !found || rec.Owner != "owner-1" {
			t.Fatalf("duplicate (owner %q) = %+v, %v, %v; want owner-1's record found", owner, rec, found, err)
		}
	}
	// Redeem does not answer from records: the token is used.
	if _, err := f.svc.Redeem(ctx, is.Token, "checkout", ""); !errors.Is(err, token.ErrUsed) {
		t.Fatalf("Redeem of a recorded token = %v, want ErrUsed", err)
	}
	if ok, err := f.store.Complete(ctx, store.TokenRecordKey(is.ID), "owner-1", []byte("303"), time.Hour); err != nil || !ok {
		t.Fatalf("Complete = %v, %v", ok, err)
	}
	// After the token's exp its record still answers; another purpose does not.
	f.clock.Advance(time.Minute)
	if _, rec, found, err := f.svc.RedeemRecord(ctx, is.Token, "checkout", "", "owner-3", time.Minute); err != nil || !found || !rec.Completed || string(rec.Response) != "303" {
		t.Fatalf("late duplicate = %+v, %v, %v; want the completed record", rec, found, err)
	}
	if _, _, _, err := f.svc.RedeemRecord(ctx, is.Token, "login", "", "owner-3", time.Minute); !errors.Is(err, token.ErrExpired) {
		t.Fatalf("late duplicate for another purpose = %v, want ErrExpired", err)
	}
	// An expired token without a record is never redeemed.
	late := f.issue(t, token.IssueRequest{TTL: 10 * time.Second})
	f.clock.Advance(time.Minute)
	if _, _, found, err := f.svc.RedeemRecord(ctx, late.Token, "", "", "owner-4", time.Minute); !errors.Is(err, token.ErrExpired) || found {
		t.Fatalf("expired token = %v, %v; want ErrExpired", found, err)
	}
}

func TestParseExpired(t *testing.T) {
	f := newFixture(t)
	is := f.issue(t, token.IssueRequest{Purpose: "checkout", TTL: 10 * time.Second})
	now := f.clock.Now().Unix()
	expiredClaims := `{"jti":"1","iat":` + itoa(now-100) + `,"exp":` + itoa(now-60) + `,"pur":"default"}`
	parts := strings.Split(is.Token, ".")
	tests := []struct {
		name   string
		tok    string
		wantID string // "" when refused with ErrInvalid
	}{
		{"an expired token", is.Token, is.ID},
		{"an expired token in another header form", sign(`{"alg":"HS256","kid":"a"}`, expiredClaims, keyA.Secret), "1"},
		{"an expired token with a bad signature", sign(`{"alg":"HS256","kid":"a"}`, expiredClaims, keyB.Secret), ""},
		{"an expired token with this service's header and a bad signature", parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(expiredClaims)) + "." + parts[2], ""},
		{"no exp", sign(`{"alg":"HS256","kid":"a"}`, `{"jti":"1","iat":`+itoa(now)+`,"pur":"default"}`, keyA.Secret), ""},
		{"no iat", sign(`{"alg":"HS256","kid":"a"}`, `{"jti":"1","exp":`+itoa(now-60)+`,"pur":"default"}`, keyA.Secret), ""},
		{"a bad purpose claim", sign(`{"alg":"HS256","kid":"a"}`, `{"jti":"1","iat":`+itoa(now-100)+`,"exp":`+itoa(now-60)+`,"pur":"a b"}`, keyA.Secret), ""},
		{"alg none", base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"a"}`)) + "." + parts[1] + ".", ""},
		{"garbage", "a.b.c", ""},
	}
	f.clock.Advance(time.Hour) // every token above has expired by now
	for _, tc := range tests {
		c, err := f.svc.Parse(tc.tok)
		switch {
		case tc.wantID == "" && (!errors.Is(err, token.ErrInvalid) || c != token.Claims{}):
			t.Errorf("%s: = %+v, %v; want no claims and ErrInvalid", tc.name, c, err)
		case tc.wantID != "" && (!errors.Is(err, token.ErrExpired) || c.ID != tc.wantID):
			t.Errorf("%s: = %+v, %v; want ID %s with ErrExpired", tc.name, c, err, tc.wantID)
		}
	}
}
