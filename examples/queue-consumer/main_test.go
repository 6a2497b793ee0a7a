package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newKeeper(t *testing.T) *idempotency.Keeper {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	return idempotency.New(st)
}

var order1 = Message{ID: "msg-1", Body: []byte("order-1")}

func TestRedeliveredMessageIsProcessedOnce(t *testing.T) {
	pay := &payments{}
	c := NewConsumer(newKeeper(t), pay.Charge)
	deliveries := []struct {
		name         string
		wantReplayed bool
	}{
		{"first delivery charges", false},
		{"first redelivery replays the receipt", true},
		{"second redelivery replays it too", true},
		{"third redelivery as well", true},
	}
	var first string
	for _, d := range deliveries {
		receipt, replayed, ack, err := c.Process(context.Background(), order1)
		if err != nil || !ack || replayed != d.wantReplayed {
			t.Fatalf("%s: replayed=%v ack=%v err=%v", d.name, replayed, ack, err)
		}
		if first == "" {
			first = receipt
		}
		if receipt != first {
			t.Fatalf("%s: receipt %q, want the first one %q", d.name, receipt, first)
		}
	}
	if n := pay.n.Load(); n != 1 {
		t.Fatalf("charged %d times, want 1", n)
	}
}

func TestConcurrentDeliveriesChargeOnce(t *testing.T) {
	const n = 3
	var charges atomic.Int32
	hold := make(chan struct{})
	c := NewConsumer(newKeeper(t), func(ctx context.Context, order []byte) (string, error) {
		charges.Add(1)
		<-hold // until the other deliveries have answered
		return "receipt", nil
	})
	type result struct {
		receipt string
		ack     bool
		err     error
	}
	results := make(chan result, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			receipt, _, ack, err := c.Process(context.Background(), order1)
			results <- result{receipt, ack, err}
		})
	}
	var got []result
	for range n - 1 {
		got = append(got, <-results)
	}
	close(hold)
	wg.Wait()
	got = append(got, <-results)
	acked := 0
	for _, r := range got {
		switch {
		case r.ack && r.err == nil && r.receipt == "receipt":
			acked++
		case !r.ack && errors.Is(r.err, idempotency.ErrInProgress):
		default:
			t.Errorf("unexpected result %+v", r)
		}
	}
	if charges.Load() != 1 || acked != 1 {
		t.Fatalf("charges=%d acknowledged=%d, want 1 and 1", charges.Load(), acked)
	}
	if receipt, replayed, ack, err := c.Process(context.Background(), order1); receipt != "receipt" || !replayed || !ack || err != nil {
		t.Fatalf("redelivery after the charge: %q %v %v %v", receipt, replayed, ack, err)
	}
}

func TestFailedChargeIsRetriedOnRedelivery(t *testing.T) {
	var calls atomic.Int32
	c := NewConsumer(newKeeper(t), func(ctx context.Context, order []byte) (string, error) {
		if calls.Add(1) == 1 {
			return "", errors.New("payment provider timed out")
		}
		return "receipt", nil
	})
	steps := []struct {
		name    string
		wantAck bool
	}{
		{"the failed charge is not acknowledged", false},
		{"the redelivery charges", true},
		{"the next redelivery replays", true},
	}
	for _, s := range steps {
		if _, _, ack, _ := c.Process(context.Background(), order1); ack != s.wantAck {
			t.Fatalf("%s: ack = %v", s.name, ack)
		}
	}
	if calls.Load() != 2 {
		t.Fatalf("charge called %d times, want 2 (one failure, one success)", calls.Load())
	}
}

func TestReusedMessageIDIsDropped(t *testing.T) {
	pay := &payments{}
	c := NewConsumer(newKeeper(t), pay.Charge)
	if _, _, _, err := c.Process(context.Background(), order1); err != nil {
		t.Fatal(err)
	}
	_, _, ack, err := c.Process(context.Background(), Message{ID: order1.ID, Body: []byte("order-99")})
	if !ack || !errors.Is(err, idempotency.ErrFingerprintMismatch) || pay.n.Load() != 1 {
		t.Fatalf("ack=%v err=%v charges=%d", ack, err, pay.n.Load())
	}
}

// charged matches the line of a delivery that charged.
var charged = regexp.MustCompile(`(?m): msg-\d charged: `)

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "5 deliveries, 2 charges\n") || len(charged.FindAllString(out.String(), -1)) != 2 {
		t.Fatalf("output:\n%s", out.String())
	}
}
