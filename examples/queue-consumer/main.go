// Command queue-consumer shows the idempotency core outside HTTP: a
// worker pool reads payment messages from an at-least-once queue, which
// delivers some of them more than once, and charges each order exactly
// once. Every delivery of a message gets the receipt of the one charge
// that happened, so the reply can be sent again safely.
//
// Run it with
//
//	go run ./examples/queue-consumer
//
// It keeps its records in the embedded memory store, which serves one
// process; workers in several processes share a store/redis Store
// instead. A delivery whose message another worker is processing right
// now (idempotency.ErrInProgress) is put back on the queue, as a broker
// would redeliver an unacknowledged message after a delay.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store/memory"
)

// Message is one delivery of a queue message.
type Message struct {
	// ID is the message's ID, the same on every delivery: the key.
	ID string
	// Body is the order to charge.
	Body []byte
}

// Consumer charges the order in each message at most once per message
// ID. Create it with NewConsumer.
type Consumer struct {
	keeper *idempotency.Keeper
	charge func(ctx context.Context, order []byte) (receipt string, err error)
}

// NewConsumer returns a Consumer that records its work with keeper and
// charges orders with charge.
func NewConsumer(keeper *idempotency.Keeper, charge func(ctx context.Context, order []byte) (string, error)) *Consumer {
	return &Consumer{keeper: keeper, charge: charge}
}

// Process handles one delivery of m. It returns the receipt of the
// message's one charge, whether this delivery only replayed it, and
// whether the delivery may be acknowledged: not when another worker is
// charging the order right now or the charge failed (the record is then
// released), so that the queue delivers it again.
func (c *Consumer) Process(ctx context.Context, m Message) (receipt string, replayed, ack bool, err error) {
	sum := sha256.Sum256(m.Body) // the same ID with another body is refused
	out, replayed, err := c.keeper.Do(ctx, m.ID, hex.EncodeToString(sum[:]), func(ctx context.Context) (idempotency.Outcome, error) {
		r, err := c.charge(ctx, m.Body)
		if err != nil {
			return idempotency.Outcome{}, err
		}
		return idempotency.Outcome{Body: []byte(r)}, nil
	})
	switch {
	case errors.Is(err, idempotency.ErrFingerprintMismatch):
		return "", false, true, err // a poison message: drop it
	case err != nil:
		return "", false, false, err
	}
	return string(out.Body), replayed, true, nil
}

// payments is a fake payment provider that counts its charges.
type payments struct{ n atomic.Int64 }

func (p *payments) Charge(_ context.Context, order []byte) (string, error) {
	return fmt.Sprintf("receipt-%d for %s", p.n.Add(1), order), nil
}

// redeliveryDelay is how long the fake queue waits before it delivers an
// unacknowledged message again.
const redeliveryDelay = 10 * time.Millisecond

// consume runs workers over deliveries, putting back the ones not
// acknowledged after redeliveryDelay, until every delivery is
// acknowledged. It writes one line
// per delivery to out.
func consume(ctx context.Context, c *Consumer, deliveries []Message, workers int, out io.Writer) {
	queue := make(chan Message, len(deliveries))
	var pending sync.WaitGroup
	pending.Add(len(deliveries))
	for _, m := range deliveries {
		queue <- m
	}
	var mu sync.Mutex // serializes output lines
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for m := range queue {
				receipt, replayed, ack, err := c.Process(ctx, m)
				mu.Lock()
				switch {
				case !ack:
					fmt.Fprintf(out, "worker %d: %s not acknowledged (%v): redelivered\n", w, m.ID, err)
				case err != nil:
					fmt.Fprintf(out, "worker %d: %s dropped: %v\n", w, m.ID, err)
				case replayed:
					fmt.Fprintf(out, "worker %d: %s already charged: %s\n", w, m.ID, receipt)
				default:
					fmt.Fprintf(out, "worker %d: %s charged: %s\n", w, m.ID, receipt)
				}
				mu.Unlock()
				if !ack { // redeliver later, as a broker does; the buffer has room
					time.AfterFunc(redeliveryDelay, func() { queue <- m })
					continue
				}
				pending.Done()
			}
		})
	}
	pending.Wait()
	close(queue)
	wg.Wait()
}

func run(ctx context.Context, out io.Writer) error {
	st := memory.New()
	defer st.Close()
	pay := &payments{}
	c := NewConsumer(idempotency.New(st), pay.Charge)
	// The queue delivers order-1 three times and order-2 twice.
	deliveries := []Message{
		{ID: "msg-1", Body: []byte("order-1")},
		{ID: "msg-2", Body: []byte("order-2")},
		{ID: "msg-1", Body: []byte("order-1")},
		{ID: "msg-1", Body: []byte("order-1")},
		{ID: "msg-2", Body: []byte("order-2")},
	}
	consume(ctx, c, deliveries, 3, out)
	_, err := fmt.Fprintf(out, "%d deliveries, %d charges\n", len(deliveries), pay.n.Load())
	return err
}

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		log.Fatal(err)
	}
}
